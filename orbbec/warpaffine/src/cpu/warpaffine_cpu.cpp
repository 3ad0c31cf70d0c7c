// CPU kernels of warp_affine: one output row per task of at::parallel_for, the per-pixel math in
// common/warpaffine.h (the same code the CUDA kernels run, hence the same bits).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "warpaffine/src/warpaffine_ext.h"

namespace orbbec {
namespace warpaffine {
namespace {

template <typename scalar_t>
using acc_type = typename std::conditional<std::is_same<scalar_t, double>::value, double, float>::type;

struct Geometry {
  int64_t B, C, H, W, OH, OW;
  int64_t s0, s1, s2, s3;  // src strides (elements)
  int64_t o0, o1, o2, o3;  // out strides
};

Geometry geometry(const at::Tensor& src, const at::Tensor& out) {
  return {src.size(0),   src.size(1),   src.size(2),   src.size(3),   out.size(2),   out.size(3),
          src.stride(0), src.stride(1), src.stride(2), src.stride(3), out.stride(0), out.stride(1),
          out.stride(2), out.stride(3)};
}

template <typename scalar_t>
void forward_kernel(const at::Tensor& src, const at::Tensor& mat, at::Tensor& out, int64_t interp,
                    int64_t border, const BorderValues& bv) {
  using acc_t = acc_type<scalar_t>;
  const Geometry g = geometry(src, out);
  const scalar_t* sp = src.data_ptr<scalar_t>();
  scalar_t* op = out.data_ptr<scalar_t>();
  const double* mp = mat.data_ptr<double>();
  // The border value as the image type holds it (cv2 saturates it to the type first).
  std::vector<acc_t> bval(g.C);
  for (int64_t c = 0; c < g.C; ++c) bval[c] = static_cast<acc_t>(Store<scalar_t, double>::cast(bv[c]));

  at::parallel_for(0, g.B * g.OH, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / g.OH, y = r % g.OH;
      const double* M = mp + b * 6;
      const double rx = row_term(M[1], M[2], y), ry = row_term(M[4], M[5], y);
      const scalar_t* img = sp + b * g.s0;
      scalar_t* orow = op + b * g.o0 + y * g.o2;
      for (int64_t x = 0; x < g.OW; ++x) {
        const Taps<acc_t> t =
            make_taps(source_coord(M[0], rx, x, acc_t()), source_coord(M[3], ry, x, acc_t()), interp);
        for (int64_t c = 0; c < g.C; ++c) {
          const scalar_t* plane = img + c * g.s1;
          auto fetch = [&](int64_t ix, int64_t iy) {
            return static_cast<acc_t>(plane[iy * g.s2 + ix * g.s3]);
          };
          orow[c * g.o1 + x * g.o3] = Store<scalar_t, acc_t>::cast(sample(t, g.H, g.W, border, bval[c], fetch));
        }
      }
    }
  });
}

at::Tensor warp_affine_cpu(const at::Tensor& src, const at::Tensor& inv_matrix, int64_t out_h,
                           int64_t out_w, int64_t interpolation, int64_t border_mode,
                           at::ArrayRef<double> border_value) {
  const BorderValues bv =
      check_forward_args(src, inv_matrix, out_h, out_w, interpolation, border_mode, border_value);
  at::Tensor out = at::empty({src.size(0), src.size(1), out_h, out_w},
                             src.options().memory_format(output_format(src)));
  if (out.numel() == 0) return out;
  const at::Tensor mat = inv_matrix.to(at::kDouble).contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND3(at::kByte, at::kHalf, at::kBFloat16, src.scalar_type(), "warp_affine_cpu", [&] {
    forward_kernel<scalar_t>(src, mat, out, interpolation, border_mode, bv);
  });
  return out;
}

// Backward, one image per task (taps of different output pixels of one image may share a source
// pixel, so the image's gradient is accumulated by a single thread). The matrix gradient follows
// from d(sx)/dM = (x, y, 1) and the derivative of the tap weights in fx, fy.
template <typename scalar_t>
void backward_kernel(const at::Tensor& grad_out, const at::Tensor& src, const at::Tensor& mat,
                     at::Tensor& grad_src_acc, at::Tensor& grad_mat, int64_t interp, int64_t border,
                     const BorderValues& bv, bool need_src, bool need_mat) {
  using acc_t = acc_type<scalar_t>;
  const Geometry g = geometry(src, grad_out);
  const scalar_t* sp = src.data_ptr<scalar_t>();
  const scalar_t* gp = grad_out.data_ptr<scalar_t>();
  acc_t* gs = grad_src_acc.data_ptr<acc_t>();  // contiguous NCHW accumulator
  double* gm = grad_mat.data_ptr<double>();
  const double* mp = mat.data_ptr<double>();
  at::parallel_for(0, g.B, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const double* M = mp + b * 6;
      double dm[6] = {0, 0, 0, 0, 0, 0};
      for (int64_t y = 0; y < g.OH; ++y) {
        const double rx = row_term(M[1], M[2], y), ry = row_term(M[4], M[5], y);
        for (int64_t x = 0; x < g.OW; ++x) {
          const Taps<acc_t> t =
              make_taps(source_coord(M[0], rx, x, acc_t()), source_coord(M[3], ry, x, acc_t()), interp);
          if (!t.valid) continue;
          acc_t w[16], dwx[16], dwy[16];
          tap_weights(t, w, dwx, dwy);
          double gx = 0, gy = 0;
          for (int64_t c = 0; c < g.C; ++c) {
            const acc_t go = static_cast<acc_t>(gp[b * g.o0 + c * g.o1 + y * g.o2 + x * g.o3]);
            if (go == acc_t(0)) continue;
            for (int j = 0; j < t.n; ++j) {
              for (int i = 0; i < t.n; ++i) {
                int64_t ix = t.x0 + i, iy = t.y0 + j;
                const int k = j * t.n + i;
                // A tap on the constant border has no source pixel to send gradient to, but its
                // value still moves the output when the matrix moves the sample point.
                const bool inside = resolve_tap(ix, iy, g.H, g.W, border);
                if (inside && need_src) gs[((b * g.C + c) * g.H + iy) * g.W + ix] += w[k] * go;
                if (need_mat) {
                  const double v = inside ? double(sp[b * g.s0 + c * g.s1 + iy * g.s2 + ix * g.s3])
                                          : double(static_cast<acc_t>(Store<scalar_t, double>::cast(bv[c])));
                  gx += double(dwx[k]) * double(v) * double(go);
                  gy += double(dwy[k]) * double(v) * double(go);
                }
              }
            }
          }
          dm[0] += gx * x; dm[1] += gx * y; dm[2] += gx;
          dm[3] += gy * x; dm[4] += gy * y; dm[5] += gy;
        }
      }
      for (int k = 0; k < 6; ++k) gm[b * 6 + k] = dm[k];
    }
  });
}

std::tuple<at::Tensor, at::Tensor> warp_affine_backward_cpu(const at::Tensor& grad_out, const at::Tensor& src,
                                                            const at::Tensor& inv_matrix, int64_t interpolation,
                                                            int64_t border_mode, at::ArrayRef<double> border_value,
                                                            bool need_src_grad, bool need_matrix_grad) {
  const BorderValues bv = check_backward_args(grad_out, src, inv_matrix, interpolation, border_mode, border_value);
  const auto acc_dtype = src.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor grad_src_acc = at::zeros({src.size(0), src.size(1), src.size(2), src.size(3)},
                                      src.options().dtype(acc_dtype));
  at::Tensor grad_mat = at::zeros({src.size(0), 2, 3}, src.options().dtype(at::kDouble));
  const at::Tensor mat = inv_matrix.to(at::kDouble).contiguous();
  if (grad_out.numel() > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "warp_affine_backward_cpu", [&] {
      backward_kernel<scalar_t>(grad_out, src, mat, grad_src_acc, grad_mat, interpolation, border_mode,
                                bv, need_src_grad, need_matrix_grad);
    });
  }
  return {grad_src_acc.to(src.scalar_type()).contiguous(output_format(src)),
          grad_mat.to(inv_matrix.scalar_type())};
}

}  // namespace
}  // namespace warpaffine
}  // namespace orbbec

TORCH_LIBRARY_IMPL(orbbec, CPU, m) {
  m.impl("warp_affine", &orbbec::warpaffine::warp_affine_cpu);
  m.impl("warp_affine_backward", &orbbec::warpaffine::warp_affine_backward_cpu);
}
