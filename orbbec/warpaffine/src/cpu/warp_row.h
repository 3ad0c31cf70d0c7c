// The scalar row kernel of the CPU warp: image and output views and the per-pixel loop over one
// output row, in the shared header's arithmetic (common/warpaffine.h). Included by warpaffine_cpu.cpp
// and warp_row_avx2.h (one translation unit).
#pragma once
#include <vector>

#include "warpaffine/src/warpaffine_ext.h"

namespace orbbec {
namespace warpaffine {
namespace {

// One image as the kernels read it: element (c, y, x) at data[c * sc + y * sh + x * sw].
template <typename T>
struct ImageView {
  const T* data;
  int64_t H, W, sc, sh, sw;
};
// Where output element (b, c, y, x) goes.
template <typename T>
struct OutView {
  T* data;
  int64_t sb, sc, sh, sw;
};

template <typename T>
std::vector<ImageView<T>> batch_views(const at::Tensor& src) {
  std::vector<ImageView<T>> views(src.size(0));
  for (int64_t b = 0; b < src.size(0); ++b) {
    views[b] = {src.data_ptr<T>() + b * src.stride(0), src.size(2), src.size(3), src.stride(1), src.stride(2),
                src.stride(3)};
  }
  return views;
}

template <typename T>
OutView<T> out_view(at::Tensor& out) {
  return {out.data_ptr<T>(), out.stride(0), out.stride(1), out.stride(2), out.stride(3)};
}

// Output pixels [x_begin, x_end) of row y. CN > 0 fixes the channel count at compile time and
// PLAIN says the output transform is off, so the common uint8 3-channel warp runs without
// per-value branches.
template <typename in_t, typename out_t, int CN, bool PLAIN>
void warp_span(const ImageView<in_t>& im, const double* M, int64_t y, out_t* orow, const OutView<out_t>& out,
               int64_t C_dynamic, int64_t x_begin, int64_t x_end, int64_t interp, int64_t border,
               const acc_type<in_t>* bval, const OutputTransform& ot) {
  using acc_t = acc_type<in_t>;
  const int64_t C = CN > 0 ? CN : C_dynamic;
  const double rx = row_term(M[1], M[2], y), ry = row_term(M[4], M[5], y);
  const int64_t sw = im.sw, sh = im.sh, sc = im.sc, osc = out.sc, osw = out.sw;
  for (int64_t x = x_begin; x < x_end; ++x) {
    const Taps<acc_t> t = make_taps(source_coord(M[0], rx, x, acc_t()), source_coord(M[3], ry, x, acc_t()), interp);
    if (t.valid && t.n == 2 && t.x0 >= 0 && t.x0 < im.W - 1 && t.y0 >= 0 && t.y0 < im.H - 1) {
      // Bilinear with all four taps inside: the common case, without per-tap border tests.
      const in_t* p = im.data + t.y0 * sh + t.x0 * sw;
      out_t* o = orow + x * osw;
      for (int64_t c = 0; c < C; ++c) {
        const in_t* q = p + (PLAIN ? c : ot.source_channel(c, C)) * sc;
        const acc_t v = blend_bilinear<acc_t>(q[0], q[sw], q[sh], q[sh + sw], t.fx, t.fy);
        o[c * osc] = Store<out_t, acc_t>::cast(PLAIN ? v : ot.apply(v, c));
      }
      continue;
    }
    if (t.valid && t.n == 1 && t.x0 >= 0 && t.x0 < im.W && t.y0 >= 0 && t.y0 < im.H) {
      // Nearest inside the image: one tap, no border tests.
      const in_t* p = im.data + t.y0 * sh + t.x0 * sw;
      for (int64_t c = 0; c < C; ++c) {
        const acc_t v = static_cast<acc_t>(p[(PLAIN ? c : ot.source_channel(c, C)) * sc]);
        orow[c * osc + x * osw] = Store<out_t, acc_t>::cast(PLAIN ? v : ot.apply(v, c));
      }
      continue;
    }
    if (t.valid && t.n == 4 && t.x0 >= 0 && t.x0 < im.W - 3 && t.y0 >= 0 && t.y0 < im.H - 3) {
      // Bicubic with all 16 taps inside: the weights once per pixel, not per channel, and the sum in
      // sample()'s order (the same bits).
      acc_t wx[4], wy[4];
      cubic_weights(t.fx, wx);
      cubic_weights(t.fy, wy);
      const in_t* p = im.data + t.y0 * sh + t.x0 * sw;
      for (int64_t c = 0; c < C; ++c) {
        const in_t* q = p + (PLAIN ? c : ot.source_channel(c, C)) * sc;
        acc_t sum = acc_t(0);
        for (int j = 0; j < 4; ++j) {
          acc_t row = acc_t(0);
          for (int i = 0; i < 4; ++i) row = add_rn(row, mul_rn(wx[i], static_cast<acc_t>(q[j * sh + i * sw])));
          sum = add_rn(sum, mul_rn(wy[j], row));
        }
        orow[c * osc + x * osw] = Store<out_t, acc_t>::cast(PLAIN ? sum : ot.apply(sum, c));
      }
      continue;
    }
    if (t.valid) {
      // Near or off the edge: map the tap columns and rows once per pixel (through the border
      // rule, or to -1 for the constant border's outside), then blend each channel as sample()
      // does (the same bits).
      const bool constant = border == kConstant;
      int64_t xs[4], ys[4];
      for (int k = 0; k < t.n; ++k) {
        const int64_t ix = int64_t(t.x0) + k, iy = int64_t(t.y0) + k;
        xs[k] = ix >= 0 && ix < im.W ? ix * sw : constant ? -1 : border_index(ix, im.W, border) * sw;
        ys[k] = iy >= 0 && iy < im.H ? iy * sh : constant ? -1 : border_index(iy, im.H, border) * sh;
      }
      acc_t wx[4], wy[4];
      if (t.n == 4) {
        cubic_weights(t.fx, wx);
        cubic_weights(t.fy, wy);
      }
      for (int64_t c = 0; c < C; ++c) {
        const int64_t cs = ot.source_channel(c, C);
        const in_t* q = im.data + cs * sc;
        auto at = [&](int i, int j) {
          return xs[i] < 0 || ys[j] < 0 ? bval[cs] : static_cast<acc_t>(q[ys[j] + xs[i]]);
        };
        acc_t v;
        if (t.n == 1) {
          v = at(0, 0);
        } else if (t.n == 2) {
          v = blend_bilinear(at(0, 0), at(1, 0), at(0, 1), at(1, 1), t.fx, t.fy);
        } else {
          v = acc_t(0);
          for (int j = 0; j < 4; ++j) {
            acc_t row = acc_t(0);
            for (int i = 0; i < 4; ++i) row = add_rn(row, mul_rn(wx[i], at(i, j)));
            v = add_rn(v, mul_rn(wy[j], row));
          }
        }
        orow[c * osc + x * osw] = Store<out_t, acc_t>::cast(ot.apply(v, c));
      }
      continue;
    }
    for (int64_t c = 0; c < C; ++c) {
      const int64_t cs = ot.source_channel(c, C);
      const in_t* plane = im.data + cs * sc;
      auto fetch = [&](int64_t ix, int64_t iy) { return static_cast<acc_t>(plane[iy * sh + ix * sw]); };
      const acc_t v = sample(t, im.H, im.W, border, bval[cs], fetch);
      orow[c * osc + x * osw] = Store<out_t, acc_t>::cast(ot.apply(v, c));
    }
  }
}

// One whole output row (the signature warp_images calls through).
template <typename in_t, typename out_t, int CN, bool PLAIN>
void warp_row(const ImageView<in_t>& im, const double* M, int64_t y, out_t* orow, const OutView<out_t>& out,
              int64_t C, int64_t OW, int64_t interp, int64_t border, const acc_type<in_t>* bval,
              const OutputTransform& ot) {
  warp_span<in_t, out_t, CN, PLAIN>(im, M, y, orow, out, C, 0, OW, interp, border, bval, ot);
}

}  // namespace
}  // namespace warpaffine
}  // namespace orbbec
