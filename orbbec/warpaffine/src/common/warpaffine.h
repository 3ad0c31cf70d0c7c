// Sampling and border arithmetic of warp_affine, shared by the CPU and CUDA kernels so that both
// devices compute the same bits.
//
// Conventions (OpenCV's): the matrix handed to the kernels maps an OUTPUT pixel (x, y) to the
// INPUT position it samples (WARP_INVERSE_MAP); pixel centres sit on integer coordinates.
// Arithmetic follows OpenCV 5's warpAffine: source coordinates and bilinear blending in float32
// (float64 for float64 images), so uint8 results match cv2.warpAffine to the last level on all
// but a few pixels in ten thousand.
#pragma once
#include <cmath>
#include <cstdint>

#include "common/src/arith.h"

namespace orbbec {
namespace warpaffine {

enum Interpolation : int64_t { kNearest = 0, kBilinear = 1, kBicubic = 2 };
// cv2.BORDER_* values, end to end: the Python API passes cv2's codes through unchanged.
enum BorderMode : int64_t { kConstant = 0, kReplicate = 1, kReflect = 2, kWrap = 3, kReflect101 = 4 };

// Per-channel values (the constant border values, and the fused output's mean and std) travel by
// value in the kernel arguments, so they are capped at this many channels.
constexpr int kMaxBorderChannels = 64;
struct BorderValues {
  double v[kMaxBorderChannels];
  int count;  // 1: one value for every channel
  ORBBEC_HD double operator[](int64_t c) const { return count == 1 ? v[0] : v[c]; }
};

// Coordinates further than this from the image are treated like non-finite ones: the pixel gets
// the constant border value whatever the border mode (documented in docs/warpaffine.md).
constexpr double kMaxCoord = 1073741824.0;  // 2^30, so integer tap arithmetic cannot overflow

// What happens to a sampled value on its way out (the fused output of warp_affine_fused):
// out[c] = (v[c'] * scale - mean[c]) / std[c] with c' = C - 1 - c when channels are reversed
// (BGR <-> RGB). The sampled value is not rounded to the image type first.
struct OutputTransform {
  bool normalize;
  bool reverse_channels;
  float scale;
  float mean[kMaxBorderChannels];
  float std[kMaxBorderChannels];
  ORBBEC_HD int64_t source_channel(int64_t c, int64_t C) const { return reverse_channels ? C - 1 - c : c; }
  template <typename acc_t>
  ORBBEC_HD acc_t apply(acc_t v, int64_t c) const {
    return normalize ? normalized(v, c) : v;
  }
  // the order and rounding of torch's (x * scale - mean) / std, so fused == unfused bit for bit
  template <typename acc_t>
  ORBBEC_HD acc_t normalized(acc_t v, int64_t c) const {
    const acc_t scaled = mul_rn(v, static_cast<acc_t>(scale));
    return div_rn(add_rn(scaled, -static_cast<acc_t>(mean[c])), static_cast<acc_t>(std[c]));
  }
};

// Source coordinate of output column x in a row whose constant part row_term = m1*y + m2 was
// computed once. OpenCV 5 does fma(float(m0), x, float(row_term)) in float32: the product of a
// float and an integer below 2^24 is exact in double, so one double add rounded to float gives the
// fma's single rounding, on hosts without an fma instruction as well.
// x and y arrive as doubles (exact for any pixel index): converting a 64-bit integer is slow on GPUs.
// source_coord_rounded takes m0 and row_term already rounded to float (and held as doubles), so
// that a pixel loop can hoist the roundings. On the GPU the multiply and add are one double fma:
// the product is exact, so the fma's single rounding is the add's, the same bits in one
// instruction fewer per coordinate.
ORBBEC_HD float source_coord_rounded(double m0_f, double row_term_f, double x) {
#if defined(__CUDA_ARCH__)
  return static_cast<float>(__fma_rn(m0_f, x, row_term_f));
#else
  return static_cast<float>(add_rn(mul_rn(m0_f, x), row_term_f));
#endif
}
ORBBEC_HD double round_to_float(double v) { return static_cast<double>(static_cast<float>(v)); }
ORBBEC_HD float source_coord(double m0, double row_term, double x, float) {
  return source_coord_rounded(round_to_float(m0), round_to_float(row_term), x);
}
ORBBEC_HD double source_coord(double m0, double row_term, double x, double) {
  return add_rn(mul_rn(m0, x), row_term);
}
ORBBEC_HD double row_term(double m1, double m2, double y) {
  return add_rn(mul_rn(m1, y), m2);
}

ORBBEC_HD bool coord_ok(double c) { return ::fabs(c) < kMaxCoord; }  // false for NaN and inf
// The same test for a float (exact: 2^30 is a float); no conversion to double on the GPU.
ORBBEC_HD bool coord_ok(float c) { return ::fabsf(c) < static_cast<float>(kMaxCoord); }

// floor() for a coordinate already known to pass coord_ok (|v| < 2^30, so 32 bits hold it): an
// integer conversion and a compare, where the library floor is a function call on CPUs without
// SSE4.1. 32-bit, because 64-bit conversions run at a fraction of the rate on GPUs.
template <typename acc_t>
ORBBEC_HD int32_t floor_coord(acc_t v) {
  const int32_t i = static_cast<int32_t>(v);  // truncates toward zero
  return v < static_cast<acc_t>(i) ? i - 1 : i;
}

// Maps an out-of-range tap index into [0, len) (OpenCV's borderInterpolate, in closed form so
// that far-away taps cost the same as near ones). Only called for modes other than constant.
// Templated on the index type: the CUDA forward kernel works in 32 bits (64-bit division is a long
// subroutine on GPUs), the rest in 64.
template <typename index_t>
ORBBEC_HD index_t border_index(index_t p, index_t len, int64_t mode) {
  if (p >= 0 && p < len) return p;
  if (mode == kReplicate) return p < 0 ? 0 : len - 1;
  if (mode == kWrap) {
    index_t q = p % len;
    return q < 0 ? q + len : q;
  }
  if (len == 1) return 0;
  const index_t delta = (mode == kReflect101) ? 1 : 0;
  const index_t period = 2 * len - 2 * delta;
  index_t q = p % period;
  if (q < 0) q += period;
  return q < len ? q : period - 1 + delta - q;
}

// Inverse of one 2 x 3 affine matrix (row-major m -> inv), as cv2.invertAffineTransform: a singular
// matrix gives zeros. The same operations in the same order as orbbec.warpaffine.invert_affine's
// torch formula, so the op and the formula agree bit for bit (no fma on either device).
ORBBEC_HD void invert_affine_2x3(const double* m, double* inv) {
  const double a = m[0], b = m[1], c = m[2], d = m[3], e = m[4], f = m[5];
  const double det = a * e - b * d;
  const double inv_det = det != 0 ? 1.0 / det : 0.0;
  const double A11 = e * inv_det, A22 = a * inv_det, A12 = -b * inv_det, A21 = -d * inv_det;
  inv[0] = A11; inv[1] = A12; inv[2] = -A11 * c - A12 * f;
  inv[3] = A21; inv[4] = A22; inv[5] = -A21 * c - A22 * f;
}

// Image b's sampling map (output pixel -> input position, 6 doubles) from M [B, 2, 3] read through
// its element strides in its own float type (float -> double is exact, as M.to(float64) is), and
// inverted with invert_affine_2x3 when M maps source to destination. The CPU op and the CUDA
// matrix preparation both read M this way, so an expanded or float32 M needs no tensor copy.
template <typename T>
ORBBEC_HD void sampling_map(const T* M, int64_t b, int64_t s0, int64_t s1, int64_t s2, bool invert, double* out) {
  double m[6];
  for (int i = 0; i < 6; ++i) m[i] = static_cast<double>(M[b * s0 + (i / 3) * s1 + (i % 3) * s2]);
  if (invert) {
    invert_affine_2x3(m, out);
  } else {
    for (int i = 0; i < 6; ++i) out[i] = m[i];
  }
}

// Saturating conversion of the interpolated value to the image type (cv::saturate_cast).
template <typename scalar_t, typename acc_t>
struct Store {
  ORBBEC_HD static scalar_t cast(acc_t v) { return static_cast<scalar_t>(v); }
};
template <typename acc_t>
struct Store<uint8_t, acc_t> {
  ORBBEC_HD static uint8_t cast(acc_t v) {
    // Saturate in float first: the same on both devices for any value, NaN and inf included (an
    // int conversion of a huge value wraps on the CPU and saturates on the GPU). Then round half
    // to even, as cvRound / lrint.
    const float f = static_cast<float>(v);
#if defined(__CUDA_ARCH__)
    // Clamp (fmaxf maps NaN to 0), then round half to even by adding 2^23: in [2^23, 2^23 + 256)
    // floats are the integers, so the add rounds like __float2int_rn, without the slow F2I unit.
    const float clamped = fminf(fmaxf(f, 0.0f), 255.0f);
    return static_cast<uint8_t>(__float_as_uint(__fadd_rn(clamped, 8388608.0f)) & 0xFFu);
#else
    if (!(f >= 0.0f)) return 0;  // negative or NaN
    if (f >= 255.0f) return 255;
    return static_cast<uint8_t>(::lrintf(f));  // inlined with -fno-math-errno
#endif
  }
};

// OpenCV's bicubic kernel (a = -0.75) for the four taps at offsets -1, 0, 1, 2 from floor(x).
// Written with the correctly rounded helpers: nvcc would fuse the plain expressions into fmas on
// the GPU only, and bicubic uint8 results would differ between CPU and CUDA.
template <typename acc_t>
ORBBEC_HD void cubic_weights(acc_t t, acc_t w[4]) {
  const acc_t A = acc_t(-0.75), one = acc_t(1);
  const acc_t u = add_rn(t, one), s = add_rn(one, -t);
  // w0 = ((A u - 5A) u + 8A) u - 4A ; w1,2 = ((A + 2) r - (A + 3)) r r + 1 for r = t, 1 - t
  w[0] = add_rn(mul_rn(add_rn(mul_rn(add_rn(mul_rn(A, u), acc_t(3.75)), u), acc_t(-6)), u), acc_t(3));
  w[1] = add_rn(mul_rn(mul_rn(add_rn(mul_rn(acc_t(1.25), t), acc_t(-2.25)), t), t), one);
  w[2] = add_rn(mul_rn(mul_rn(add_rn(mul_rn(acc_t(1.25), s), acc_t(-2.25)), s), s), one);
  w[3] = add_rn(add_rn(add_rn(one, -w[0]), -w[1]), -w[2]);
}
// d w_k / d t, for the matrix gradient (no bit-exactness needed here).
template <typename acc_t>
ORBBEC_HD void cubic_weight_derivs(acc_t t, acc_t d[4]) {
  const acc_t A = acc_t(-0.75);
  const acc_t u = t + acc_t(1), s = acc_t(1) - t;
  d[0] = (acc_t(3) * A * u - acc_t(10) * A) * u + acc_t(8) * A;
  d[1] = (acc_t(3) * (A + acc_t(2)) * t - acc_t(2) * (A + acc_t(3))) * t;
  d[2] = -(acc_t(3) * (A + acc_t(2)) * s - acc_t(2) * (A + acc_t(3))) * s;
  d[3] = -(d[0] + d[1] + d[2]);
}

// One output pixel's taps: up to 4 x 4 source positions from (x0, y0) and the fractional position
// that weights them. sample() reads them through a fetch(ix, iy) functor; this struct only says
// where to read and how much each read counts.
template <typename acc_t>
struct Taps {
  int32_t x0, y0;   // first tap (|x0|, |y0| <= 2^30 + 1: coordinates pass coord_ok)
  int n;            // taps per axis: 1 nearest, 2 bilinear, 4 bicubic
  acc_t fx, fy;     // fractional position (bilinear, bicubic)
  bool valid;       // false: non-finite or far-away coordinate, the pixel is the border value
};

template <typename acc_t>
ORBBEC_HD Taps<acc_t> make_taps(acc_t sx, acc_t sy, int64_t interpolation) {
  Taps<acc_t> t;
  t.valid = coord_ok(sx) && coord_ok(sy);
  if (!t.valid) {
    t.x0 = t.y0 = 0; t.n = 1; t.fx = t.fy = acc_t(0);
    return t;
  }
  if (interpolation == kNearest) {
    t.x0 = static_cast<int32_t>(::rint(sx));  // round half to even, as cvRound
    t.y0 = static_cast<int32_t>(::rint(sy));
    t.n = 1; t.fx = t.fy = acc_t(0);
  } else {
    const int32_t x0 = floor_coord(sx), y0 = floor_coord(sy);
    t.x0 = x0;
    t.y0 = y0;
    t.fx = sx - static_cast<acc_t>(x0);  // exact: sx and floor(sx) are within one binade
    t.fy = sy - static_cast<acc_t>(y0);
    t.n = 2;
    if (interpolation == kBicubic) { t.x0 -= 1; t.y0 -= 1; t.n = 4; }
  }
  return t;
}

// Bilinear blend in OpenCV 5's order of operations: along x first, then y.
template <typename acc_t>
ORBBEC_HD acc_t blend_bilinear(acc_t p00, acc_t p01, acc_t p10, acc_t p11, acc_t fx, acc_t fy) {
  const acc_t v0 = add_rn(p00, mul_rn(fx, p01 - p00));
  const acc_t v1 = add_rn(p10, mul_rn(fx, p11 - p10));
  return add_rn(v0, mul_rn(fy, v1 - v0));
}

// Value of one channel at `taps`. Fetch(ix, iy) returns the channel's value at an in-image tap;
// taps outside the image follow the border mode. index_t: the CUDA forward kernel's inline path
// works in 32 bits (64-bit index arithmetic cost it registers), the rest in 64.
template <typename index_t, typename acc_t, typename Fetch>
ORBBEC_HD acc_t sample(const Taps<acc_t>& t, index_t H, index_t W, int64_t border_mode,
                       acc_t border_value, const Fetch& fetch) {
  if (!t.valid) return border_value;
  auto at = [&](index_t ix, index_t iy) -> acc_t {
    if (ix >= 0 && ix < W && iy >= 0 && iy < H) return fetch(ix, iy);
    if (border_mode == kConstant) return border_value;
    return fetch(border_index(ix, W, border_mode), border_index(iy, H, border_mode));
  };
  const index_t x0 = static_cast<index_t>(t.x0), y0 = static_cast<index_t>(t.y0);
  if (t.n == 1) return at(x0, y0);
  if (t.n == 2) return blend_bilinear(at(x0, y0), at(x0 + 1, y0), at(x0, y0 + 1), at(x0 + 1, y0 + 1), t.fx, t.fy);
  acc_t wx[4], wy[4];
  cubic_weights(t.fx, wx);
  cubic_weights(t.fy, wy);
  acc_t sum = acc_t(0);
  for (int j = 0; j < 4; ++j) {
    acc_t row = acc_t(0);
    for (int i = 0; i < 4; ++i) row = add_rn(row, mul_rn(wx[i], at(x0 + i, y0 + j)));
    sum = add_rn(sum, mul_rn(wy[j], row));
  }
  return sum;
}

// Weights of each tap and their derivatives in fx and fy (for the backward pass). Arrays are
// indexed [j * n + i] for tap (x0 + i, y0 + j).
template <typename acc_t>
ORBBEC_HD void tap_weights(const Taps<acc_t>& t, acc_t w[16], acc_t dwx[16], acc_t dwy[16]) {
  acc_t ax[4], ay[4], dx[4], dy[4];
  if (t.n == 1) {
    ax[0] = ay[0] = acc_t(1); dx[0] = dy[0] = acc_t(0);
  } else if (t.n == 2) {
    ax[0] = acc_t(1) - t.fx; ax[1] = t.fx; dx[0] = acc_t(-1); dx[1] = acc_t(1);
    ay[0] = acc_t(1) - t.fy; ay[1] = t.fy; dy[0] = acc_t(-1); dy[1] = acc_t(1);
  } else {
    cubic_weights(t.fx, ax); cubic_weight_derivs(t.fx, dx);
    cubic_weights(t.fy, ay); cubic_weight_derivs(t.fy, dy);
  }
  for (int j = 0; j < t.n; ++j) {
    for (int i = 0; i < t.n; ++i) {
      w[j * t.n + i] = ax[i] * ay[j];
      dwx[j * t.n + i] = dx[i] * ay[j];
      dwy[j * t.n + i] = ax[i] * dy[j];
    }
  }
}

// Where a tap reads from in the backward pass: an out-of-image tap is mapped into the image by the
// border mode (ix, iy updated); returns false when it reads the constant border instead.
ORBBEC_HD bool resolve_tap(int64_t& ix, int64_t& iy, int64_t H, int64_t W, int64_t border_mode) {
  if (ix >= 0 && ix < W && iy >= 0 && iy < H) return true;
  if (border_mode == kConstant) return false;
  ix = border_index(ix, W, border_mode);
  iy = border_index(iy, H, border_mode);
  return true;
}

// The backward pass at output pixel (x, y) of one image, whose source position is (sx, sy): the
// same operations in the same order on both devices. The callers say where things are and how
// gradient is added: grad_out(c) and src(c, iy, ix) read the upstream gradient and a source pixel
// in the caller's layout, grad_src(c, iy, ix) is the address of a source pixel's gradient and
// add(address, value) adds to it (directly on the CPU, where one thread owns an image; with an
// atomic on CUDA, where threads share one). The pixel's share of the matrix gradient, from
// d(sx)/dM = (x, y, 1) and the derivatives of the tap weights in fx, fy, is added to dm; the
// callers reduce dm across pixels their own way.
template <typename scalar_t, typename GradOut, typename Src, typename GradSrc, typename Add>
ORBBEC_HD void backward_pixel(acc_type<scalar_t> sx, acc_type<scalar_t> sy, int64_t x, int64_t y, int64_t C,
                              int64_t H, int64_t W, int64_t interp, int64_t border, const BorderValues& bv,
                              bool need_src, bool need_mat, const GradOut& grad_out, const Src& src,
                              const GradSrc& grad_src, const Add& add, double dm[6]) {
  using acc_t = acc_type<scalar_t>;
  const Taps<acc_t> t = make_taps(sx, sy, interp);
  if (!t.valid) return;
  acc_t w[16], dwx[16], dwy[16];
  tap_weights(t, w, dwx, dwy);
  double gx = 0, gy = 0;
  for (int64_t c = 0; c < C; ++c) {
    const acc_t go = static_cast<acc_t>(grad_out(c));
    // A zero gradient contributes nothing, even from an inf/NaN source pixel (0 * inf would make
    // grad_matrix NaN); on CUDA the skip also saves the atomics.
    if (go == acc_t(0)) continue;
    for (int j = 0; j < t.n; ++j) {
      for (int i = 0; i < t.n; ++i) {
        int64_t ix = t.x0 + i, iy = t.y0 + j;
        const int k = j * t.n + i;
        // A tap on the constant border has no source pixel to send gradient to, but its value
        // still moves the output when the matrix moves the sample point.
        const bool inside = resolve_tap(ix, iy, H, W, border);
        if (inside && need_src) {
          // the address before the product, as the CUDA kernel had it: in the other order ptxas
          // gives its float64 instance registers past an allocation step (less occupancy)
          acc_t* const to = grad_src(c, iy, ix);
          add(to, w[k] * go);
        }
        if (need_mat) {
          const double v = inside ? double(src(c, iy, ix))
                                  : double(static_cast<acc_t>(Store<scalar_t, double>::cast(bv[c])));
          gx += double(dwx[k]) * v * double(go);
          gy += double(dwy[k]) * v * double(go);
        }
      }
    }
  }
  dm[0] += gx * x; dm[1] += gx * y; dm[2] += gx;
  dm[3] += gy * x; dm[4] += gy * y; dm[5] += gy;
}

}  // namespace warpaffine
}  // namespace orbbec
