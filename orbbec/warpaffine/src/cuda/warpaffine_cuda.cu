// CUDA kernels of warp_affine.
//
// Forward: one block per 32 x 16 output tile of one image. The block first copies the input
// rectangle its tile samples from (the footprint) into shared memory with 16-byte loads, then each
// thread interpolates its pixels from there. Gathering taps straight from global memory costs a
// narrow, scattered load per tap; the staged copy reads each input byte once, coalesced. Tiles whose
// footprint does not fit in shared memory (strong downscaling) gather from global memory instead;
// the arithmetic is the shared code of common/warpaffine.h either way, so CPU and CUDA agree.
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "common/src/cuda_utils.cuh"
#include "warpaffine/src/warpaffine_ext.h"

namespace orbbec {
namespace warpaffine {
namespace {

template <typename scalar_t>
using acc_type = typename std::conditional<std::is_same<scalar_t, double>::value, double, float>::type;

constexpr int kTileW = 32, kTileH = 16, kThreads = 256;
constexpr int kRowsPerPass = kThreads / kTileW;                 // 8 output rows per sweep
constexpr int kPixelsPerThread = kTileW * kTileH / kThreads;    // 2
constexpr int kSmemBytes = 40 * 1024;

// src and out are both contiguous NCHW, or both contiguous NHWC (channels_last).
struct Layout {
  int64_t B, C, H, W, OH, OW;
  bool channels_last;
};

__device__ __forceinline__ int64_t element_offset(const Layout& L, int64_t b, int64_t c, int64_t y,
                                                  int64_t x, int64_t H, int64_t W) {
  return L.channels_last ? ((b * H + y) * W + x) * L.C + c : ((b * L.C + c) * H + y) * W + x;
}

// The input rectangle [x0, x1] x [y0, y1] one tile samples from, clipped to the image.
struct Footprint {
  int64_t x0, x1, y0, y1;
  bool usable;  // finite, non-empty
};

template <typename acc_t>
__device__ Footprint tile_footprint(const double* M, int64_t tx0, int64_t ty0, int64_t tx1, int64_t ty1,
                                    int64_t interp, int64_t H, int64_t W) {
  double minx = INFINITY, maxx = -INFINITY, miny = INFINITY, maxy = -INFINITY;
  bool finite = true;
  for (int k = 0; k < 4; ++k) {
    const int64_t x = (k & 1) ? tx1 : tx0, y = (k & 2) ? ty1 : ty0;
    const double sx = source_coord(M[0], row_term(M[1], M[2], y), x, acc_t());
    const double sy = source_coord(M[3], row_term(M[4], M[5], y), x, acc_t());
    finite = finite && coord_ok(sx) && coord_ok(sy);
    minx = fmin(minx, sx); maxx = fmax(maxx, sx);
    miny = fmin(miny, sy); maxy = fmax(maxy, sy);
  }
  Footprint f{0, -1, 0, -1, false};
  if (!finite) return f;
  const int64_t lo = interp == kBicubic ? 1 : 0, hi = interp == kBicubic ? 2 : 1;
  f.x0 = max(int64_t(floor(minx)) - lo, int64_t(0));
  f.x1 = min(int64_t(floor(maxx)) + hi, W - 1);
  f.y0 = max(int64_t(floor(miny)) - lo, int64_t(0));
  f.y1 = min(int64_t(floor(maxy)) + hi, H - 1);
  f.usable = f.x0 <= f.x1 && f.y0 <= f.y1;
  return f;
}

// Copies rows [f.y0, f.y1] of `planes` consecutive planes into shared memory. Each shared row
// starts at the 16-byte aligned address below its first byte, so every copy is one 16-byte load
// and store; words that would reach outside the tensor are copied byte by byte.
__device__ void stage_planes(unsigned char* smem, const unsigned char* row0_first_byte_of_plane0,
                             int64_t plane_stride_bytes, int64_t row_stride_bytes, int64_t rows,
                             int64_t pitch, int64_t planes, int64_t row_bytes,
                             const unsigned char* begin, const unsigned char* end) {
  const int64_t words_per_row = pitch / 16;
  const int64_t items = planes * rows * words_per_row;
  for (int64_t i = threadIdx.x; i < items; i += blockDim.x) {
    const int64_t w = i % words_per_row, r = (i / words_per_row) % rows, q = i / (words_per_row * rows);
    const unsigned char* first = row0_first_byte_of_plane0 + q * plane_stride_bytes + r * row_stride_bytes;
    const unsigned char* aligned = reinterpret_cast<const unsigned char*>(
        reinterpret_cast<uintptr_t>(first) & ~uintptr_t(15));
    const int64_t shift = first - aligned;
    if (16 * w >= shift + row_bytes) continue;  // past this row's bytes
    const unsigned char* g = aligned + 16 * w;
    unsigned char* s = smem + (q * rows + r) * pitch + 16 * w;
    if (g >= begin && g + 16 <= end) {
      *reinterpret_cast<uint4*>(s) = __ldg(reinterpret_cast<const uint4*>(g));
    } else {
      for (int k = 0; k < 16; ++k) {
        if (g + k >= begin && g + k < end) s[k] = g[k];
      }
    }
  }
}

// One input image: contiguous NCHW (planes of H x W) or NHWC (rows of W x C).
struct ImageDesc {
  const unsigned char* data;
  int64_t H, W;
};

struct ForwardParams {
  const ImageDesc* images;    // a list input: one per image, in device memory; nullptr for a batch
  const unsigned char* base;  // a batch tensor: image b starts at base + b * C * H * W elements
  int64_t B, C, H, W, OH, OW;
  bool in_channels_last, out_channels_last;
  int64_t interp, border;
  BorderValues bv;
  OutputTransform ot;
};

__device__ __forceinline__ int64_t image_offset(bool channels_last, int64_t C, int64_t H, int64_t W, int64_t c,
                                                int64_t y, int64_t x) {
  return channels_last ? (y * W + x) * C + c : (c * H + y) * W + x;
}

template <typename in_t, typename out_t>
__global__ void __launch_bounds__(kThreads)
    warp_forward_kernel(const ForwardParams p, out_t* __restrict__ out, const double* __restrict__ mats,
                        int64_t tiles_x, int64_t tiles_per_image) {
  using acc_t = acc_type<in_t>;
  constexpr int64_t es = sizeof(in_t);
  extern __shared__ __align__(16) unsigned char smem[];
  const int64_t C = p.C;
  const bool cl = p.in_channels_last;
  const int64_t c_inner = cl ? C : 1;  // channels interleaved in a staged row
  const int64_t planes = cl ? 1 : C;

  for (int64_t b = blockIdx.y; b < p.B; b += gridDim.y) {
    const ImageDesc im = p.images ? p.images[b] : ImageDesc{p.base + b * C * p.H * p.W * es, p.H, p.W};
    const int64_t H = im.H, W = im.W;
    const in_t* src = reinterpret_cast<const in_t*>(im.data);
    const unsigned char* begin = im.data;
    const unsigned char* end = begin + C * H * W * es;
    const double* M = mats + b * 6;
    for (int64_t tile = blockIdx.x; tile < tiles_per_image; tile += gridDim.x) {
      const int64_t tx0 = (tile % tiles_x) * kTileW, ty0 = (tile / tiles_x) * kTileH;
      const int64_t tx1 = min(tx0 + kTileW, p.OW) - 1, ty1 = min(ty0 + kTileH, p.OH) - 1;

      // This thread's pixels: column tx0 + lane, rows ty0 + row + 8k.
      const int64_t x = tx0 + threadIdx.x % kTileW;
      Taps<acc_t> taps[kPixelsPerThread];
      bool active[kPixelsPerThread];
      int64_t ys[kPixelsPerThread];
#pragma unroll
      for (int k = 0; k < kPixelsPerThread; ++k) {
        ys[k] = ty0 + threadIdx.x / kTileW + kRowsPerPass * k;
        active[k] = x <= tx1 && ys[k] <= ty1;
        taps[k] = make_taps(source_coord(M[0], row_term(M[1], M[2], ys[k]), x, acc_t()),
                            source_coord(M[3], row_term(M[4], M[5], ys[k]), x, acc_t()), p.interp);
      }

      const Footprint f = tile_footprint<acc_t>(M, tx0, ty0, tx1, ty1, p.interp, H, W);
      const int64_t rows = f.y1 - f.y0 + 1;
      const int64_t row_bytes = (f.x1 - f.x0 + 1) * c_inner * es;
      const int64_t pitch = (row_bytes + 15 + 15) / 16 * 16;
      const int64_t planes_per_pass = f.usable ? min(planes, kSmemBytes / (pitch * rows)) : 0;
      const bool staged = planes_per_pass > 0;
      const int64_t step = staged ? planes_per_pass : planes;

      for (int64_t p0 = 0; p0 < planes; p0 += step) {
        const int64_t np = min(step, planes - p0);
        // Byte address of pixel (f.x0, f.y0) of plane p0 (NCHW) or of the image (NHWC).
        const unsigned char* corner = begin + image_offset(cl, C, H, W, cl ? 0 : p0, f.y0, f.x0) * es;
        if (staged) {
          stage_planes(smem, corner, H * W * es, W * c_inner * es, rows, pitch, np, row_bytes, begin, end);
          __syncthreads();
        }
        // Output channels whose source channel lies in this pass.
        for (int64_t c = 0; c < C; ++c) {
          const int64_t cs = p.ot.source_channel(c, C);
          if (!cl && (cs < p0 || cs >= p0 + np)) continue;
          const in_t* plane = src + image_offset(cl, C, H, W, cs, 0, 0);
          const int64_t q = cl ? 0 : cs - p0;  // staged plane
          auto fetch = [&](int64_t ix, int64_t iy) -> acc_t {
            if (staged && ix >= f.x0 && ix <= f.x1 && iy >= f.y0 && iy <= f.y1) {
              const unsigned char* first = corner + q * H * W * es + (iy - f.y0) * W * c_inner * es;
              const int64_t shift = reinterpret_cast<uintptr_t>(first) & 15;
              const unsigned char* s = smem + (q * rows + (iy - f.y0)) * pitch + shift +
                                       ((ix - f.x0) * c_inner + (cl ? cs : 0)) * es;
              return static_cast<acc_t>(*reinterpret_cast<const in_t*>(s));
            }
            return static_cast<acc_t>(plane[(iy * W + ix) * c_inner]);
          };
          const acc_t bval = static_cast<acc_t>(Store<in_t, double>::cast(p.bv[cs]));
#pragma unroll
          for (int k = 0; k < kPixelsPerThread; ++k) {
            if (!active[k]) continue;
            const acc_t v = sample(taps[k], H, W, p.border, bval, fetch);
            const int64_t o = b * C * p.OH * p.OW + image_offset(p.out_channels_last, C, p.OH, p.OW, c, ys[k], x);
            out[o] = Store<out_t, acc_t>::cast(p.ot.apply(v, c));
          }
        }
        if (staged) __syncthreads();  // the next pass or tile overwrites shared memory
      }
    }
  }
}

template <typename in_t, typename out_t>
void launch_forward(const ForwardParams& p, at::Tensor& out, const at::Tensor& mat) {
  const int64_t tiles_x = (p.OW + kTileW - 1) / kTileW;
  const int64_t tiles = tiles_x * ((p.OH + kTileH - 1) / kTileH);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(tiles, 1 << 30)),
                  static_cast<unsigned>(std::min<int64_t>(p.B, 65535)));
  warp_forward_kernel<in_t, out_t><<<grid, kThreads, kSmemBytes, current_stream()>>>(
      p, out.data_ptr<out_t>(), mat.data_ptr<double>(), tiles_x, tiles);
  ORBBEC_LAUNCH_CHECK();
}

template <typename in_t>
void launch_fused(const ForwardParams& p, at::Tensor& out, const at::Tensor& mat) {
  switch (out.scalar_type()) {
    case at::kFloat: launch_forward<in_t, float>(p, out, mat); break;
    case at::kHalf: launch_forward<in_t, at::Half>(p, out, mat); break;
    case at::kBFloat16: launch_forward<in_t, at::BFloat16>(p, out, mat); break;
    case at::kByte: launch_forward<in_t, uint8_t>(p, out, mat); break;
    default: TORCH_INTERNAL_ASSERT(false, "out_dtype was checked");
  }
}

ForwardParams batch_params(const at::Tensor& in, const at::Tensor& out, bool out_channels_last,
                           int64_t interpolation, int64_t border_mode, const BorderValues& bv,
                           const OutputTransform& ot) {
  return {nullptr, static_cast<const unsigned char*>(in.data_ptr()), in.size(0), in.size(1), in.size(2), in.size(3),
          out.size(2), out.size(3), output_format(in) == at::MemoryFormat::ChannelsLast, out_channels_last,
          interpolation, border_mode, bv, ot};
}

at::Tensor warp_affine_cuda(const at::Tensor& src, const at::Tensor& inv_matrix, int64_t out_h,
                            int64_t out_w, int64_t interpolation, int64_t border_mode,
                            at::ArrayRef<double> border_value) {
  const BorderValues bv =
      check_forward_args(src, inv_matrix, out_h, out_w, interpolation, border_mode, border_value);
  c10::cuda::CUDAGuard guard(src.device());
  const at::MemoryFormat fmt = output_format(src);
  const at::Tensor in = src.contiguous(fmt);  // a copy only for layouts other than NCHW / NHWC
  at::Tensor out = at::empty({src.size(0), src.size(1), out_h, out_w}, src.options().memory_format(fmt));
  if (out.numel() == 0) return out;
  const at::Tensor mat = inv_matrix.to(at::kDouble).contiguous();
  const ForwardParams p = batch_params(in, out, fmt == at::MemoryFormat::ChannelsLast, interpolation, border_mode,
                                       bv, OutputTransform{});
  AT_DISPATCH_FLOATING_TYPES_AND3(at::kByte, at::kHalf, at::kBFloat16, src.scalar_type(), "warp_affine_cuda", [&] {
    launch_forward<scalar_t, scalar_t>(p, out, mat);
  });
  return out;
}

at::Tensor warp_affine_fused_cuda(const at::Tensor& src, const at::Tensor& inv_matrix, int64_t out_h, int64_t out_w,
                                  int64_t interpolation, int64_t border_mode, at::ArrayRef<double> border_value,
                                  at::ScalarType out_dtype, at::ArrayRef<double> mean, at::ArrayRef<double> std,
                                  double scale, bool reverse_channels, bool channels_last_out) {
  const BorderValues bv =
      check_forward_args(src, inv_matrix, out_h, out_w, interpolation, border_mode, border_value);
  const OutputTransform ot = check_output_args(src.size(1), out_dtype, mean, std, scale, reverse_channels);
  c10::cuda::CUDAGuard guard(src.device());
  const at::Tensor in = src.contiguous(output_format(src));
  at::Tensor out = make_fused_output(src.size(0), src.size(1), out_h, out_w, out_dtype, channels_last_out, src.device());
  if (out.numel() == 0) return out;
  const at::Tensor mat = inv_matrix.to(at::kDouble).contiguous();
  const ForwardParams p = batch_params(in, out, channels_last_out, interpolation, border_mode, bv, ot);
  AT_DISPATCH_FLOATING_TYPES_AND3(at::kByte, at::kHalf, at::kBFloat16, src.scalar_type(), "warp_affine_fused_cuda", [&] {
    launch_fused<scalar_t>(p, out, mat);
  });
  return out;
}

// A list of HWC images of different sizes in one launch: their addresses and sizes travel as a
// small table, copied host -> device from pinned memory on the current stream (no host sync).
at::Tensor warp_affine_list_cuda(at::TensorList images, const at::Tensor& inv_matrix, int64_t out_h, int64_t out_w,
                                 int64_t interpolation, int64_t border_mode, at::ArrayRef<double> border_value,
                                 at::ScalarType out_dtype, at::ArrayRef<double> mean, at::ArrayRef<double> std,
                                 double scale, bool reverse_channels, bool channels_last_out) {
  const BorderValues bv = check_list_args(images, inv_matrix, out_h, out_w, interpolation, border_mode, border_value);
  const int64_t B = static_cast<int64_t>(images.size()), C = images[0].size(2);
  const OutputTransform ot = check_output_args(C, out_dtype, mean, std, scale, reverse_channels);
  c10::cuda::CUDAGuard guard(images[0].device());
  std::vector<at::Tensor> contiguous;
  contiguous.reserve(images.size());
  for (const at::Tensor& im : images) contiguous.push_back(im.contiguous());
  at::Tensor table = at::empty({B * int64_t(sizeof(ImageDesc))}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  auto* descs = reinterpret_cast<ImageDesc*>(table.data_ptr());
  for (int64_t b = 0; b < B; ++b) {
    descs[b] = {static_cast<const unsigned char*>(contiguous[b].data_ptr()), contiguous[b].size(0), contiguous[b].size(1)};
  }
  const at::Tensor table_dev = table.to(images[0].device(), /*non_blocking=*/true);
  at::Tensor out = make_fused_output(B, C, out_h, out_w, out_dtype, channels_last_out, images[0].device());
  const at::Tensor mat = inv_matrix.to(at::kDouble).contiguous();
  ForwardParams p{reinterpret_cast<const ImageDesc*>(table_dev.data_ptr()), nullptr, B, C, 0, 0, out_h, out_w,
                  /*in_channels_last=*/true, channels_last_out, interpolation, border_mode, bv, ot};
  AT_DISPATCH_FLOATING_TYPES_AND3(at::kByte, at::kHalf, at::kBFloat16, images[0].scalar_type(), "warp_affine_list_cuda", [&] {
    launch_fused<scalar_t>(p, out, mat);
  });
  // `table` may be freed now: a non_blocking copy from pinned memory records an event on the
  // stream, and the caching host allocator does not reuse the block before the copy has run.
  return out;
}

// Backward: one thread per output pixel, gradients scattered with atomics (float accumulator);
// the matrix gradient is reduced in shared memory per block first.
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
      const Taps<acc_t> t = make_taps(source_coord(M[0], row_term(M[1], M[2], y), x, acc_t()),
                                      source_coord(M[3], row_term(M[4], M[5], y), x, acc_t()), interp);
      if (!t.valid) continue;
      acc_t w[16], dwx[16], dwy[16];
      tap_weights(t, w, dwx, dwy);
      double gx = 0, gy = 0;
      for (int64_t c = 0; c < L.C; ++c) {
        const acc_t go = static_cast<acc_t>(grad_out[element_offset(L, b, c, y, x, L.OH, L.OW)]);
        // As the CPU kernel: a zero gradient contributes nothing. Without the skip, an inf/NaN
        // source pixel gives 0 * inf = NaN in grad_matrix here but 0 on CPU (and it saves atomics).
        if (go == acc_t(0)) continue;
        for (int j = 0; j < t.n; ++j) {
          for (int k0 = 0; k0 < t.n; ++k0) {
            int64_t ix = t.x0 + k0, iy = t.y0 + j;
            const int k = j * t.n + k0;
            const bool inside = resolve_tap(ix, iy, H, W, border);
            if (inside && need_src) atomicAdd(grad_src + ((b * L.C + c) * H + iy) * W + ix, w[k] * go);
            if (need_mat) {
              const double v = inside ? double(src[element_offset(L, b, c, iy, ix, H, W)])
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
  m.impl("warp_affine_backward", &orbbec::warpaffine::warp_affine_backward_cuda);
  m.impl("warp_affine_fused", &orbbec::warpaffine::warp_affine_fused_cuda);
  m.impl("warp_affine_list", &orbbec::warpaffine::warp_affine_list_cuda);
}
