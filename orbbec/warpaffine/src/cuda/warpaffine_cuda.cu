// CUDA entry points of warp_affine (argument checks, launches) and the backward kernel. The
// forward kernel is in warpaffine_forward.cuh.
#include <algorithm>

#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "warpaffine/src/cuda/warpaffine_forward.cuh"

ORBBEC_WARP_FORWARD_TYPES(ORBBEC_WARP_FORWARD_EXTERN)

namespace orbbec {
namespace warpaffine {
namespace {

using forward_cuda::ForwardParams;
using forward_cuda::ImageDesc;
using forward_cuda::kThreads;
using forward_cuda::launch_fused;


// Backward's layout: src and out are both contiguous NCHW, or both contiguous NHWC (channels_last).
struct Layout {
  int64_t B, C, H, W, OH, OW;
  bool channels_last;
};

__device__ __forceinline__ int64_t element_offset(const Layout& L, int64_t b, int64_t c, int64_t y,
                                                  int64_t x, int64_t H, int64_t W) {
  return L.channels_last ? ((b * H + y) * W + x) * L.C + c : ((b * L.C + c) * H + y) * W + x;
}

// The forward kernel's tap offsets and border arithmetic inside one input image are 32-bit.
void check_image_size(int64_t C, int64_t H, int64_t W, const char* name) {
  ORBBEC_CHECK_VALUE(C * H * W < (int64_t(1) << 31), "orbbec: each image of '", name,
                     "' must hold fewer than 2^31 elements on CUDA, got ", C * H * W);
  ORBBEC_CHECK_VALUE(H <= (int64_t(1) << 30) && W <= (int64_t(1) << 30), "orbbec: the height and width of '",
                     name, "' must be at most 2^30 on CUDA, got ", H, " x ", W);
}

// The kernels read contiguous float64 inverse maps. A matrix in any other form (float32, strided,
// expanded, or forward maps to invert) is converted by one small kernel launched here: inverting in
// each block's prologue instead cost the fused kernels 4-6% (docs/dev/warpaffine.md).
__global__ void prepare_matrices_kernel(forward_cuda::MatrixArg m, double* __restrict__ out, int64_t n) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < n; b += int64_t(gridDim.x) * blockDim.x) {
    if (m.is_double) {
      sampling_map(static_cast<const double*>(m.data), b, m.sb, m.sr, m.sc, m.invert, out + 6 * b);
    } else {
      sampling_map(static_cast<const float*>(m.data), b, m.sb, m.sr, m.sc, m.invert, out + 6 * b);
    }
  }
}

// `M` is [B, 2, 3] on the device, possibly expanded (checked by the caller).
at::Tensor prepare_matrices(const at::Tensor& M, bool invert_matrix, int64_t B) {
  if (!invert_matrix && M.scalar_type() == at::kDouble && M.is_contiguous() && M.size(0) == B) return M;
  at::Tensor out = at::empty({B, 6}, M.options().dtype(at::kDouble));
  if (B == 0) return out;
  const forward_cuda::MatrixArg arg{M.data_ptr(), M.stride(0), M.stride(1), M.stride(2),
                                    M.scalar_type() == at::kDouble, invert_matrix};
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((B + 127) / 128, 4096));
  prepare_matrices_kernel<<<blocks, 128, 0, current_stream()>>>(arg, out.data_ptr<double>(), B);
  ORBBEC_LAUNCH_CHECK();
  return out;
}

// Warps a batch tensor into `out`, which the caller allocated (under the input's device guard):
// the plain op's output (input dtype and layout, no output transform) or the fused op's.
at::Tensor warp_batch(const at::Tensor& src, const at::Tensor& matrix, bool invert_matrix, at::Tensor out,
                      bool out_channels_last, int64_t interpolation, int64_t border_mode, const BorderValues& bv,
                      const OutputTransform& ot) {
  if (out.numel() == 0) return out;
  const at::Tensor in = src.contiguous(output_format(src));  // a copy only for layouts other than NCHW / NHWC
  ForwardParams p{nullptr, static_cast<const unsigned char*>(in.data_ptr()),
                  in.size(1) * in.size(2) * in.size(3) * in.element_size(),
                  in.size(0), in.size(1), in.size(2), in.size(3), out.size(2), out.size(3),
                  output_format(in) == at::MemoryFormat::ChannelsLast, out_channels_last,
                  interpolation, border_mode, bv, ot};
  const at::Tensor matrices = prepare_matrices(matrix, invert_matrix, p.B);
  p.matrices = matrices.data_ptr<double>();
  AT_DISPATCH_FLOATING_TYPES_AND3(at::kByte, at::kHalf, at::kBFloat16, src.scalar_type(), "warp_affine_cuda", [&] {
    launch_fused<scalar_t>(p, out);
  });
  return out;
}

// One launch instead of the ~20 elementwise kernels of the torch formula: for a batch warp those
// launches took longer than the warp itself.
at::Tensor invert_affine_cuda(const at::Tensor& matrix) {
  check_invert_args(matrix);
  c10::cuda::CUDAGuard guard(matrix.device());
  return prepare_matrices(matrix, /*invert_matrix=*/true, matrix.size(0)).view({matrix.size(0), 2, 3});
}

at::Tensor warp_affine_cuda(const at::Tensor& src, const at::Tensor& inv_matrix, int64_t out_h,
                            int64_t out_w, int64_t interpolation, int64_t border_mode,
                            at::ArrayRef<double> border_value, bool invert_matrix) {
  const BorderValues bv =
      check_forward_args(src, inv_matrix, out_h, out_w, interpolation, border_mode, border_value);
  check_image_size(src.size(1), src.size(2), src.size(3), "src");
  c10::cuda::CUDAGuard guard(src.device());
  const at::MemoryFormat fmt = output_format(src);
  at::Tensor out = at::empty({src.size(0), src.size(1), out_h, out_w}, src.options().memory_format(fmt));
  return warp_batch(src, inv_matrix, invert_matrix, out, fmt == at::MemoryFormat::ChannelsLast, interpolation,
                    border_mode, bv, OutputTransform{});
}

at::Tensor warp_affine_fused_cuda(const at::Tensor& src, const at::Tensor& inv_matrix, int64_t out_h, int64_t out_w,
                                  int64_t interpolation, int64_t border_mode, at::ArrayRef<double> border_value,
                                  at::ScalarType out_dtype, at::ArrayRef<double> mean, at::ArrayRef<double> std,
                                  double scale, bool reverse_channels, bool channels_last_out, bool invert_matrix) {
  const BorderValues bv =
      check_forward_args(src, inv_matrix, out_h, out_w, interpolation, border_mode, border_value);
  const OutputTransform ot = check_output_args(src.size(1), out_dtype, mean, std, scale, reverse_channels);
  check_image_size(src.size(1), src.size(2), src.size(3), "src");
  c10::cuda::CUDAGuard guard(src.device());
  at::Tensor out = make_fused_output(src.size(0), src.size(1), out_h, out_w, out_dtype, channels_last_out, src.device());
  return warp_batch(src, inv_matrix, invert_matrix, out, channels_last_out, interpolation, border_mode, bv, ot);
}

// The descriptor table of a list warp is written on the device by a tiny kernel that receives the
// descriptors as its argument (kDescsPerFill per launch, 3 KB of the 4 KB argument space). Kernel
// arguments are copied at launch, and into the graph when a CUDA graph is being captured; a copy
// from a pinned host buffer would instead be replayed from that buffer's address after the caching
// host allocator had handed it to someone else.
constexpr int kDescsPerFill = 128;
struct DescChunk {
  ImageDesc d[kDescsPerFill];
};

__global__ void fill_descs_kernel(ImageDesc* __restrict__ out, DescChunk chunk, int n) {
  if (int(threadIdx.x) < n) out[threadIdx.x] = chunk.d[threadIdx.x];
}

static at::Tensor device_desc_table(const std::vector<at::Tensor>& images, c10::Device device) {
  const int64_t B = static_cast<int64_t>(images.size());
  at::Tensor table = at::empty({B * int64_t(sizeof(ImageDesc))}, at::TensorOptions().dtype(at::kByte).device(device));
  auto* out = reinterpret_cast<ImageDesc*>(table.data_ptr());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  for (int64_t first = 0; first < B; first += kDescsPerFill) {
    DescChunk chunk{};
    const int n = static_cast<int>(std::min<int64_t>(kDescsPerFill, B - first));
    for (int i = 0; i < n; ++i) {
      const at::Tensor& im = images[first + i];
      chunk.d[i] = {static_cast<const unsigned char*>(im.data_ptr()), im.size(0), im.size(1)};
    }
    fill_descs_kernel<<<1, kDescsPerFill, 0, stream>>>(out + first, chunk, n);
    ORBBEC_LAUNCH_CHECK();
  }
  return table;
}

// A list of HWC images of different sizes in one launch: their addresses and sizes travel as a
// small device table (device_desc_table: no host sync, safe under CUDA graph capture).
at::Tensor warp_affine_list_cuda(at::TensorList images, const at::Tensor& inv_matrix, int64_t out_h, int64_t out_w,
                                 int64_t interpolation, int64_t border_mode, at::ArrayRef<double> border_value,
                                 at::ScalarType out_dtype, at::ArrayRef<double> mean, at::ArrayRef<double> std,
                                 double scale, bool reverse_channels, bool channels_last_out, bool invert_matrix) {
  const BorderValues bv = check_list_args(images, inv_matrix, out_h, out_w, interpolation, border_mode, border_value);
  const int64_t B = static_cast<int64_t>(images.size()), C = images[0].size(2);
  const OutputTransform ot = check_output_args(C, out_dtype, mean, std, scale, reverse_channels);
  for (const at::Tensor& im : images) check_image_size(im.size(2), im.size(0), im.size(1), "src");
  c10::cuda::CUDAGuard guard(images[0].device());
  std::vector<at::Tensor> contiguous;
  contiguous.reserve(images.size());
  for (const at::Tensor& im : images) contiguous.push_back(im.contiguous());
  const at::Tensor table_dev = device_desc_table(contiguous, images[0].device());
  at::Tensor out = make_fused_output(B, C, out_h, out_w, out_dtype, channels_last_out, images[0].device());
  ForwardParams p{reinterpret_cast<const ImageDesc*>(table_dev.data_ptr()), nullptr, 0, B, C, 0, 0, out_h, out_w,
                  /*in_channels_last=*/true, channels_last_out, interpolation, border_mode, bv, ot};
  const at::Tensor matrices = prepare_matrices(inv_matrix, invert_matrix, B);
  p.matrices = matrices.data_ptr<double>();
  AT_DISPATCH_FLOATING_TYPES_AND3(at::kByte, at::kHalf, at::kBFloat16, images[0].scalar_type(), "warp_affine_list_cuda", [&] {
    launch_fused<scalar_t>(p, out);
  });
  return out;
}

// Backward: one thread per output pixel (the per-pixel step is backward_pixel in
// common/warpaffine.h, shared with the CPU kernel), gradients scattered with atomics (float
// accumulator); the matrix gradient is reduced in shared memory per block first.
template <typename scalar_t>
__global__ void warp_backward_kernel(const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ src,
                                     const double* __restrict__ mats, acc_type<scalar_t>* __restrict__ grad_src,
                                     double* __restrict__ grad_mat, Layout L, int64_t interp, int64_t border,
                                     BorderValues bv, bool need_src, bool need_mat) {
  using acc_t = acc_type<scalar_t>;
  __shared__ double red[6][kThreads / 32];
  const int64_t H = L.H, W = L.W, n = L.OH * L.OW;
  for (int64_t b = blockIdx.y; b < L.B; b += gridDim.y) {
    const double* M = mats + b * 6;
    double dm[6] = {0, 0, 0, 0, 0, 0};
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
      const int64_t x = i % L.OW, y = i / L.OW;
      backward_pixel<scalar_t>(
          source_coord(M[0], row_term(M[1], M[2], y), x, acc_t()),
          source_coord(M[3], row_term(M[4], M[5], y), x, acc_t()), x, y, L.C, H, W, interp, border, bv, need_src,
          need_mat, [&](int64_t c) { return grad_out[element_offset(L, b, c, y, x, L.OH, L.OW)]; },
          [&](int64_t c, int64_t iy, int64_t ix) { return src[element_offset(L, b, c, iy, ix, H, W)]; },
          [&](int64_t c, int64_t iy, int64_t ix) { return grad_src + ((b * L.C + c) * H + iy) * W + ix; },
          [](acc_t* to, acc_t v) { atomicAdd(to, v); },
          dm);
    }
    if (need_mat) {
      for (int k = 0; k < 6; ++k) {
        double v = dm[k];
        for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
        if (threadIdx.x % 32 == 0) red[k][threadIdx.x / 32] = v;
      }
      __syncthreads();
      if (threadIdx.x < 6) {
        double s = 0;
        for (int wi = 0; wi < kThreads / 32; ++wi) s += red[threadIdx.x][wi];
        atomicAdd(grad_mat + b * 6 + threadIdx.x, s);
      }
      __syncthreads();
    }
  }
}

std::tuple<at::Tensor, at::Tensor> warp_affine_backward_cuda(const at::Tensor& grad_out, const at::Tensor& src,
                                                             const at::Tensor& inv_matrix, int64_t interpolation,
                                                             int64_t border_mode, at::ArrayRef<double> border_value,
                                                             bool need_src_grad, bool need_matrix_grad) {
  const BorderValues bv = check_backward_args(grad_out, src, inv_matrix, interpolation, border_mode, border_value);
  c10::cuda::CUDAGuard guard(src.device());
  const at::MemoryFormat fmt = output_format(src);
  const at::Tensor in = src.contiguous(fmt);
  const at::Tensor go = grad_out.contiguous(fmt);
  const auto acc_dtype = src.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor grad_src = at::zeros({src.size(0), src.size(1), src.size(2), src.size(3)}, src.options().dtype(acc_dtype));
  at::Tensor grad_mat = at::zeros({src.size(0), 2, 3}, src.options().dtype(at::kDouble));
  const at::Tensor mat = inv_matrix.to(at::kDouble).contiguous();
  const Layout L{in.size(0), in.size(1), in.size(2), in.size(3), go.size(2), go.size(3),
                 fmt == at::MemoryFormat::ChannelsLast};
  if (go.numel() > 0) {
    const int64_t n = L.OH * L.OW;
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096)),
                    static_cast<unsigned>(std::min<int64_t>(L.B, 65535)));
    const cudaStream_t stream = current_stream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "warp_affine_backward_cuda", [&] {
      warp_backward_kernel<scalar_t><<<grid, kThreads, 0, stream>>>(
          go.data_ptr<scalar_t>(), in.data_ptr<scalar_t>(), mat.data_ptr<double>(),
          grad_src.data_ptr<acc_type<scalar_t>>(), grad_mat.data_ptr<double>(), L, interpolation, border_mode, bv,
          need_src_grad, need_matrix_grad);
      ORBBEC_LAUNCH_CHECK();
    });
  }
  return {grad_src.to(src.scalar_type()).contiguous(fmt), grad_mat.to(inv_matrix.scalar_type())};
}

}  // namespace
}  // namespace warpaffine
}  // namespace orbbec

TORCH_LIBRARY_IMPL(orbbec, CUDA, m) {
  m.impl("warp_affine", &orbbec::warpaffine::warp_affine_cuda);
  m.impl("invert_affine", &orbbec::warpaffine::invert_affine_cuda);
  m.impl("warp_affine_backward", &orbbec::warpaffine::warp_affine_backward_cuda);
  m.impl("warp_affine_fused", &orbbec::warpaffine::warp_affine_fused_cuda);
  m.impl("warp_affine_list", &orbbec::warpaffine::warp_affine_list_cuda);
}
