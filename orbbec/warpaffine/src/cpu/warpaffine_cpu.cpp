// CPU kernels of warp_affine: one output row per task of at::parallel_for, the per-pixel math in
// common/warpaffine.h (the same code the CUDA kernels run, hence the same bits). The row kernels
// are in warp_row.h (portable) and, for uint8 on CPUs with AVX2, warp_row_avx2.h (3-channel
// bilinear), warp_nearest_avx2.h and warp_bicubic_avx2.h (1 or 3 channels).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "warpaffine/src/cpu/warp_row.h"
#include "warpaffine/src/cpu/warp_bicubic_avx2.h"
#include "warpaffine/src/cpu/warp_nearest_avx2.h"
#include "warpaffine/src/cpu/warp_row_avx2.h"
#include "warpaffine/src/warpaffine_ext.h"

namespace orbbec {
namespace warpaffine {
namespace {

// A faster row kernel for this warp on this CPU, or nullptr.
template <typename in_t, typename out_t>
auto fast_row(int64_t C, int64_t interp, bool plain) -> decltype(&warp_row<in_t, out_t, 3, true>) {
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (std::is_same<in_t, uint8_t>::value && std::is_same<out_t, uint8_t>::value) {
    static const bool has_avx2 = __builtin_cpu_supports("avx2");
    if (has_avx2 && plain && C == 3) {
      if (interp == kNearest) return &avx2_row<NearestAvx2, 3>;
      if (interp == kBilinear) return &avx2_row<BilinearAvx2, 3>;
      if (interp == kBicubic) return &avx2_row<BicubicAvx2, 3>;
    }
    if (has_avx2 && plain && C == 1) {
      if (interp == kNearest) return &avx2_row<NearestAvx2, 1>;
      if (interp == kBicubic) return &avx2_row<BicubicAvx2, 1>;
    }
  }
#endif
  return nullptr;
}

// Pulls slice `slice` of `slices` of an image's bytes towards the core (into L2). A batch of
// images does not fit in the caches, and a rotated warp walks each image across its rows in an
// order the hardware prefetchers do not follow, so without this the kernels mostly wait for
// memory. Skipped for images too big to stay in L2 alongside the one being warped, and for sparse
// views, whose footprint is mostly bytes the warp never reads. Always inlined: GCC deems a call
// to a function that only prefetches free of effects and deletes it.
template <typename T>
inline __attribute__((always_inline)) void prefetch_image_slice(const ImageView<T>& im, int64_t C, int64_t slice,
                                                                int64_t slices) {
  constexpr int64_t kMaxBytes = 512 * 1024, kLine = 64;
  const int64_t bytes = ((C - 1) * im.sc + (im.H - 1) * im.sh + (im.W - 1) * im.sw + 1) * int64_t(sizeof(T));
  if (bytes > kMaxBytes || bytes > 2 * C * im.H * im.W * int64_t(sizeof(T))) return;
  const char* p = reinterpret_cast<const char*>(im.data);
  const int64_t per_slice = (bytes + slices - 1) / slices;
  const int64_t end = std::min(bytes, (slice + 1) * per_slice);
  for (int64_t o = slice * per_slice; o < end; o += kLine) __builtin_prefetch(p + o, 0, 2);
}

// Warps every image into out: one output row per task. The plain op is the case out_t == in_t
// with the output transform off.
template <typename in_t, typename out_t>
void warp_images(const std::vector<ImageView<in_t>>& images, const double* mats, OutView<out_t> out, int64_t C,
                 int64_t OH, int64_t OW, int64_t interp, int64_t border, const BorderValues& bv,
                 const OutputTransform& ot) {
  using acc_t = acc_type<in_t>;
  // The border value as the image type holds it (cv2 saturates it to the type first).
  std::vector<acc_t> bval(C);
  for (int64_t c = 0; c < C; ++c) bval[c] = static_cast<acc_t>(Store<in_t, double>::cast(bv[c]));
  const int64_t B = static_cast<int64_t>(images.size());
  const bool plain = !ot.normalize && !ot.reverse_channels;
  auto row = C == 3 ? (plain ? &warp_row<in_t, out_t, 3, true> : &warp_row<in_t, out_t, 3, false>)
                    : (plain ? &warp_row<in_t, out_t, 0, true> : &warp_row<in_t, out_t, 0, false>);
  if (auto fast = fast_row<in_t, out_t>(C, interp, plain)) row = fast;

  at::parallel_for(0, B * OH, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / OH, y = r % OH;
      // While warping image b, fetch image b + 2 if this task warps it too (one image ahead
      // measured slower: its bytes were often not in yet). The task's first two images are
      // fetched whole as it starts.
      constexpr int64_t kAhead = 2;
      if (r == begin) {
        for (int64_t i = b; i < std::min(b + kAhead, B); ++i) prefetch_image_slice(images[i], C, 0, 1);
      }
      if ((b + kAhead) * OH < end) prefetch_image_slice(images[b + kAhead], C, y, OH);
      row(images[b], mats + b * 6, y, out.data + b * out.sb + y * out.sh, out, C, OW, interp, border, bval.data(), ot);
    }
  });
}

// The maps the row kernels take (output pixel -> input position), B x 6 doubles (sampling_map).
std::vector<double> sampling_maps(const at::Tensor& M, bool invert) {
  const int64_t B = M.size(0);
  std::vector<double> maps(static_cast<size_t>(B) * 6);
  AT_DISPATCH_FLOATING_TYPES(M.scalar_type(), "warp_affine_maps", [&] {
    const scalar_t* m = M.data_ptr<scalar_t>();
    for (int64_t b = 0; b < B; ++b) sampling_map(m, b, M.stride(0), M.stride(1), M.stride(2), invert, maps.data() + b * 6);
  });
  return maps;
}

at::Tensor warp_affine_cpu(const at::Tensor& src, const at::Tensor& inv_matrix, int64_t out_h,
                           int64_t out_w, int64_t interpolation, int64_t border_mode,
                           at::ArrayRef<double> border_value, bool invert_matrix) {
  const BorderValues bv =
      check_forward_args(src, inv_matrix, out_h, out_w, interpolation, border_mode, border_value);
  at::Tensor out = at::empty({src.size(0), src.size(1), out_h, out_w},
                             src.options().memory_format(output_format(src)));
  if (out.numel() == 0) return out;
  const std::vector<double> mat = sampling_maps(inv_matrix, invert_matrix);
  const OutputTransform identity{};
  AT_DISPATCH_FLOATING_TYPES_AND3(at::kByte, at::kHalf, at::kBFloat16, src.scalar_type(), "warp_affine_cpu", [&] {
    warp_images<scalar_t, scalar_t>(batch_views<scalar_t>(src), mat.data(), out_view<scalar_t>(out),
                                     src.size(1), out_h, out_w, interpolation, border_mode, bv, identity);
  });
  return out;
}

// The fused op on a batch tensor or on a list of HWC images: warp, then the output transform and
// the output dtype and layout, in one pass.
template <typename in_t>
void fused_dispatch(const std::vector<ImageView<in_t>>& views, const std::vector<double>& mat, at::Tensor& out,
                    int64_t interp, int64_t border, const BorderValues& bv, const OutputTransform& ot) {
  const int64_t C = out.size(1), OH = out.size(2), OW = out.size(3);
  const double* m = mat.data();
  switch (out.scalar_type()) {
    case at::kFloat: warp_images<in_t, float>(views, m, out_view<float>(out), C, OH, OW, interp, border, bv, ot); break;
    case at::kHalf: warp_images<in_t, at::Half>(views, m, out_view<at::Half>(out), C, OH, OW, interp, border, bv, ot); break;
    case at::kBFloat16:
      warp_images<in_t, at::BFloat16>(views, m, out_view<at::BFloat16>(out), C, OH, OW, interp, border, bv, ot);
      break;
    case at::kByte: warp_images<in_t, uint8_t>(views, m, out_view<uint8_t>(out), C, OH, OW, interp, border, bv, ot); break;
    default: TORCH_INTERNAL_ASSERT(false, "out_dtype was checked");
  }
}

at::Tensor warp_affine_fused_cpu(const at::Tensor& src, const at::Tensor& inv_matrix, int64_t out_h, int64_t out_w,
                                 int64_t interpolation, int64_t border_mode, at::ArrayRef<double> border_value,
                                 at::ScalarType out_dtype, at::ArrayRef<double> mean, at::ArrayRef<double> std,
                                 double scale, bool reverse_channels, bool channels_last_out, bool invert_matrix) {
  const BorderValues bv =
      check_forward_args(src, inv_matrix, out_h, out_w, interpolation, border_mode, border_value);
  const OutputTransform ot = check_output_args(src.size(1), out_dtype, mean, std, scale, reverse_channels);
  at::Tensor out = make_fused_output(src.size(0), src.size(1), out_h, out_w, out_dtype, channels_last_out, src.device());
  if (out.numel() == 0) return out;
  const std::vector<double> mat = sampling_maps(inv_matrix, invert_matrix);
  AT_DISPATCH_FLOATING_TYPES_AND3(at::kByte, at::kHalf, at::kBFloat16, src.scalar_type(), "warp_affine_fused_cpu", [&] {
    fused_dispatch<scalar_t>(batch_views<scalar_t>(src), mat, out, interpolation, border_mode, bv, ot);
  });
  return out;
}

at::Tensor warp_affine_list_cpu(at::TensorList images, const at::Tensor& inv_matrix, int64_t out_h, int64_t out_w,
                                int64_t interpolation, int64_t border_mode, at::ArrayRef<double> border_value,
                                at::ScalarType out_dtype, at::ArrayRef<double> mean, at::ArrayRef<double> std,
                                double scale, bool reverse_channels, bool channels_last_out, bool invert_matrix) {
  const BorderValues bv = check_list_args(images, inv_matrix, out_h, out_w, interpolation, border_mode, border_value);
  const int64_t C = images[0].size(2);  // check_list_args refused an empty list
  const OutputTransform ot = check_output_args(C, out_dtype, mean, std, scale, reverse_channels);
  at::Tensor out = make_fused_output(static_cast<int64_t>(images.size()), C, out_h, out_w, out_dtype,
                                     channels_last_out, inv_matrix.device());
  if (out.numel() == 0) return out;
  const std::vector<double> mat = sampling_maps(inv_matrix, invert_matrix);
  AT_DISPATCH_FLOATING_TYPES_AND3(at::kByte, at::kHalf, at::kBFloat16, images[0].scalar_type(), "warp_affine_list_cpu", [&] {
    std::vector<ImageView<scalar_t>> views;
    for (const at::Tensor& im : images) {  // HWC: element (c, y, x) at c + y * stride(0) + x * stride(1)
      views.push_back({im.data_ptr<scalar_t>(), im.size(0), im.size(1), im.stride(2), im.stride(0), im.stride(1)});
    }
    fused_dispatch<scalar_t>(views, mat, out, interpolation, border_mode, bv, ot);
  });
  return out;
}

struct Geometry {
  int64_t B, C, H, W, OH, OW;
  int64_t s0, s1, s2, s3;  // src strides (elements)
  int64_t o0, o1, o2, o3;  // grad_out strides
};

Geometry geometry(const at::Tensor& src, const at::Tensor& out) {
  return {src.size(0),   src.size(1),   src.size(2),   src.size(3),   out.size(2),   out.size(3),
          src.stride(0), src.stride(1), src.stride(2), src.stride(3), out.stride(0), out.stride(1),
          out.stride(2), out.stride(3)};
}

// Backward, one image per task (taps of different output pixels of one image may share a source
// pixel, so the image's gradient is accumulated by a single thread); the per-pixel step is
// backward_pixel in common/warpaffine.h, shared with the CUDA kernel.
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
          backward_pixel<scalar_t>(
              source_coord(M[0], rx, x, acc_t()), source_coord(M[3], ry, x, acc_t()), x, y, g.C, g.H, g.W, interp,
              border, bv, need_src, need_mat, [&](int64_t c) { return gp[b * g.o0 + c * g.o1 + y * g.o2 + x * g.o3]; },
              [&](int64_t c, int64_t iy, int64_t ix) { return sp[b * g.s0 + c * g.s1 + iy * g.s2 + ix * g.s3]; },
              [&](int64_t c, int64_t iy, int64_t ix) { return gs + ((b * g.C + c) * g.H + iy) * g.W + ix; },
              [](acc_t* to, acc_t v) { *to += v; }, dm);
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

at::Tensor invert_affine_cpu(const at::Tensor& matrix) {
  check_invert_args(matrix);
  const at::Tensor m = matrix.contiguous();
  at::Tensor out = at::empty_like(m);
  const double* in = m.data_ptr<double>();
  double* o = out.data_ptr<double>();
  for (int64_t i = 0; i < m.size(0); ++i) invert_affine_2x3(in + 6 * i, o + 6 * i);
  return out;
}

}  // namespace
}  // namespace warpaffine
}  // namespace orbbec

TORCH_LIBRARY_IMPL(orbbec, CPU, m) {
  m.impl("invert_affine", &orbbec::warpaffine::invert_affine_cpu);
  m.impl("warp_affine", &orbbec::warpaffine::warp_affine_cpu);
  m.impl("warp_affine_backward", &orbbec::warpaffine::warp_affine_backward_cpu);
  m.impl("warp_affine_fused", &orbbec::warpaffine::warp_affine_fused_cpu);
  m.impl("warp_affine_list", &orbbec::warpaffine::warp_affine_list_cpu);
}
