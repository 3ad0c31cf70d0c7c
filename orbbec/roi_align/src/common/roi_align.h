// Geometry and bilinear sampling of roi_align, shared by the CPU and CUDA kernels so that both
// devices pool the same points with the same weights.
//
// Conventions (torchvision.ops.roi_align's): a roi row is (batch index, x1, y1, x2, y2) in image
// coordinates; spatial_scale maps them onto the feature map; aligned=True shifts them by -0.5 so
// that pixel centres sit on integer + 0.5 coordinates. Each output bin averages (or, pool_mode max,
// takes the largest of) grid_h x grid_w bilinear samples placed at the centres of a regular grid.
// A sample with y < -1, y > H, x < -1 or x > W is 0; otherwise it is clamped into the map.
#pragma once
#include <cmath>
#include <cstdint>

#include "common/src/arith.h"

namespace orbbec {
namespace roi_align {

enum PoolMode : int64_t { kAvg = 0, kMax = 1 };

// Samples per bin along one axis are capped so that grid_h * grid_w and sample indices fit in
// int32; an adaptive grid (sampling_ratio <= 0) is clamped to it, a larger fixed one is refused.
constexpr int kMaxGrid = 1 << 15;

struct Params {
  double spatial_scale;
  int64_t pooled_h, pooled_w, sampling_ratio;
  bool aligned;
};

// Where a roi's bins lie on the feature map. batch < 0: the roi pools nothing (its batch index is
// outside [0, N) or not finite, or a coordinate is not finite), every output of it is 0.
template <typename acc_t>
struct RoiGeom {
  int64_t batch;
  acc_t start_y, start_x, bin_h, bin_w;
  int grid_h, grid_w;  // samples per bin along y and x; 0 when the roi is empty along that axis
  acc_t count;         // divisor of the average: max(grid_h * grid_w, 1), as torchvision
};

// The two taps of a sample along one axis. lo < 0: the sample lies outside the map and is 0.
template <typename acc_t>
struct AxisTap {
  int lo, hi;
  acc_t wlo, whi;
};

template <typename acc_t>
ORBBEC_HD int grid_size(acc_t bin, int64_t sampling_ratio) {
  if (sampling_ratio > 0) return static_cast<int>(sampling_ratio);  // checked <= kMaxGrid
  const acc_t g = ceil(bin);
  if (!(g > acc_t(0))) return 0;  // empty (aligned rois may have zero or negative size)
  return g >= acc_t(kMaxGrid) ? kMaxGrid : static_cast<int>(g);
}

// roi points at the 5 values of one row; roi_t is the rois' dtype, acc_t the arithmetic type
// (float for float16/bfloat16/float32, double for float64).
template <typename acc_t, typename roi_t>
ORBBEC_HD RoiGeom<acc_t> make_geom(const roi_t* roi, int64_t batch_size, const Params& p) {
  RoiGeom<acc_t> g;
  g.batch = -1;
  g.start_y = g.start_x = g.bin_h = g.bin_w = acc_t(0);
  g.grid_h = g.grid_w = 0;
  g.count = acc_t(1);
  const acc_t b = static_cast<acc_t>(roi[0]);
  if (!(b >= acc_t(0) && b < static_cast<acc_t>(batch_size))) return g;  // false for NaN too
  const acc_t scale = static_cast<acc_t>(p.spatial_scale);
  const acc_t offset = p.aligned ? acc_t(0.5) : acc_t(0);
  const acc_t x1 = static_cast<acc_t>(roi[1]) * scale - offset;
  const acc_t y1 = static_cast<acc_t>(roi[2]) * scale - offset;
  const acc_t x2 = static_cast<acc_t>(roi[3]) * scale - offset;
  const acc_t y2 = static_cast<acc_t>(roi[4]) * scale - offset;
  acc_t roi_w = x2 - x1, roi_h = y2 - y1;
  // Non-finite coordinates would make the adaptive grid and the tap indices meaningless.
  if (!(is_finite(x1) && is_finite(y1) && is_finite(roi_w) && is_finite(roi_h))) return g;
  if (!p.aligned) {  // legacy mode: rois are at least one pixel
    roi_w = roi_w > acc_t(1) ? roi_w : acc_t(1);
    roi_h = roi_h > acc_t(1) ? roi_h : acc_t(1);
  }
  g.batch = static_cast<int64_t>(b);
  g.start_y = y1;
  g.start_x = x1;
  g.bin_h = roi_h / static_cast<acc_t>(p.pooled_h);
  g.bin_w = roi_w / static_cast<acc_t>(p.pooled_w);
  g.grid_h = grid_size(g.bin_h, p.sampling_ratio);
  g.grid_w = grid_size(g.bin_w, p.sampling_ratio);
  const int n = g.grid_h * g.grid_w;
  g.count = static_cast<acc_t>(n > 1 ? n : 1);
  return g;
}

// Coordinate of sample i (of grid) in bin p, in torchvision's order of operations.
template <typename acc_t>
ORBBEC_HD acc_t sample_coord(acc_t start, acc_t bin, int64_t p, int i, int grid) {
  return start + static_cast<acc_t>(p) * bin + (static_cast<acc_t>(i) + acc_t(0.5)) * bin / static_cast<acc_t>(grid);
}

template <typename acc_t>
ORBBEC_HD AxisTap<acc_t> axis_tap(acc_t v, int size) {
  AxisTap<acc_t> t;
  if (!(v >= acc_t(-1) && v <= static_cast<acc_t>(size))) {  // outside, or NaN
    t.lo = t.hi = -1;
    t.wlo = t.whi = acc_t(0);
    return t;
  }
  if (v < acc_t(0)) v = acc_t(0);
  const int lo = static_cast<int>(v);
  if (lo >= size - 1) {
    t.lo = t.hi = size - 1;
    t.wlo = acc_t(1);
    t.whi = acc_t(0);
    return t;
  }
  t.lo = lo;
  t.hi = lo + 1;
  t.whi = v - static_cast<acc_t>(lo);
  t.wlo = acc_t(1) - t.whi;
  return t;
}

// Pools one bin for VEC channels. tap_y(iy) / tap_x(ix) give the bin's sample taps, load(y, x, v)
// fills v[VEC] with the channels at an in-map pixel. acc receives the sum (avg) or the largest
// sample (max, -inf when the bin has no sample); arg the index iy * grid_w + ix of that largest
// sample, -1 if none. Max mode follows mmcv: an outside sample is 0 and competes; ties keep the first.
template <bool MAX, int VEC, typename acc_t, typename TapY, typename TapX, typename Load>
ORBBEC_HD void pool_bin(int grid_h, int grid_w, const TapY& tap_y, const TapX& tap_x,
                            const Load& load, acc_t acc[VEC], int32_t arg[VEC]) {
  for (int v = 0; v < VEC; ++v) {
    acc[v] = MAX ? -static_cast<acc_t>(INFINITY) : acc_t(0);
    arg[v] = -1;
  }
  for (int iy = 0; iy < grid_h; ++iy) {
    const AxisTap<acc_t> ty = tap_y(iy);
    for (int ix = 0; ix < grid_w; ++ix) {
      const AxisTap<acc_t> tx = tap_x(ix);
      acc_t val[VEC];
      if (ty.lo < 0 || tx.lo < 0) {
        if constexpr (!MAX) {
          continue;
        } else {
          for (int v = 0; v < VEC; ++v) val[v] = acc_t(0);
        }
      } else {
        acc_t p00[VEC], p01[VEC], p10[VEC], p11[VEC];
        load(ty.lo, tx.lo, p00);
        load(ty.lo, tx.hi, p01);
        load(ty.hi, tx.lo, p10);
        load(ty.hi, tx.hi, p11);
        const acc_t w00 = ty.wlo * tx.wlo, w01 = ty.wlo * tx.whi;
        const acc_t w10 = ty.whi * tx.wlo, w11 = ty.whi * tx.whi;
        for (int v = 0; v < VEC; ++v) val[v] = w00 * p00[v] + w01 * p01[v] + w10 * p10[v] + w11 * p11[v];
      }
      for (int v = 0; v < VEC; ++v) {
        if (MAX) {
          if (val[v] > acc[v]) {
            acc[v] = val[v];
            arg[v] = iy * grid_w + ix;
          }
        } else {
          acc[v] += val[v];
        }
      }
    }
  }
}

// The output value of a pooled bin: the average, or the max (0 for a bin without samples).
template <bool MAX, typename acc_t>
ORBBEC_HD acc_t bin_value(acc_t acc, int32_t arg, acc_t count) {
  if (MAX) return arg >= 0 ? acc : acc_t(0);
  return acc / count;
}

// Pixel range [lo, hi] that the taps of a roi's samples along one axis can touch, padded by one
// pixel on each side because rounded sample positions are monotone only up to an ulp; lo > hi when
// no sample falls on the map. Used to find the rois that touch a tile of the gradient.
template <typename acc_t>
ORBBEC_HD void axis_footprint(acc_t start, acc_t bin, int64_t pooled, int grid, int size,
                                  int& lo, int& hi) {
  lo = 1;
  hi = 0;
  if (grid <= 0) return;
  acc_t a = sample_coord(start, bin, 0, 0, grid);
  acc_t b = sample_coord(start, bin, pooled - 1, grid - 1, grid);
  if (a > b) {
    const acc_t t = a;
    a = b;
    b = t;
  }
  if (!(b >= acc_t(-1) && a <= static_cast<acc_t>(size))) return;
  a = a > acc_t(0) ? a : acc_t(0);
  b = b < static_cast<acc_t>(size) ? b : static_cast<acc_t>(size);
  const int a_i = static_cast<int>(a) - 1, b_i = static_cast<int>(b) + 2;
  lo = a_i > 0 ? a_i : 0;
  hi = b_i < size - 1 ? b_i : size - 1;
}

}  // namespace roi_align
}  // namespace orbbec
