// The forward warp kernels of warp_affine and their launch, included by one small .cu file per
// input type (forward_<type>.cu) so that nvcc compiles the instantiations in parallel.
//
// Direct gathers: each thread computes a few output pixels of a short row segment, reads their taps
// straight from global memory (the read-only cache and L2 absorb the overlap between neighbours)
// and writes them. A first version staged each tile's input footprint in shared memory; it needed
// ~200 registers per thread and ran several times slower on an H100. 3-channel uint8 bilinear
// images take the kernel of forward_c3.cuh, everything else the general kernel below.
#pragma once
#include "warpaffine/src/cuda/forward_c3.cuh"

namespace orbbec {
namespace warpaffine {
namespace forward_cuda {

// kInterp: the interpolation as a template constant (uint8 input, the hot path), or -1 to read it
// from the parameters (other input types, which keeps the number of instantiations down).
// Tap offsets inside one input image are 32-bit: 64-bit tap arithmetic doubled the registers and
// halved the occupancy. The kernel is latency-bound on its gathers: occupancy pays (kMinBlocks).
// Output addresses are formed with one 64-bit multiply per row, so outputs of any size work.
template <typename in_t, typename out_t, int kInterp, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    warp_forward_kernel(const ForwardParams p, out_t* __restrict__ out, int tiles_x, int tiles_per_image) {
  using acc_t = acc_type<in_t>;
  const int interp = kInterp >= 0 ? kInterp : static_cast<int>(p.interp);
  const int C = static_cast<int>(p.C), OH = static_cast<int>(p.OH), OW = static_cast<int>(p.OW);
  const int lane = threadIdx.x % 32;
  const int lx = lane % kPatchW, ly = (threadIdx.x / 32) * kPatchH + lane / kPatchW;

  for (int64_t b = blockIdx.y; b < p.B; b += gridDim.y) {
    const ImageDesc im = p.images ? p.images[b] : ImageDesc{p.base + b * p.image_bytes, p.H, p.W};
    const in_t* src = reinterpret_cast<const in_t*>(im.data);
    const int H = static_cast<int>(im.H), W = static_cast<int>(im.W);
    // element strides of the input image
    const int sx = p.in_channels_last ? C : 1, sy = W * sx, sc = p.in_channels_last ? 1 : H * W;
    // Tap steps of the inner path. Every pixel reads its inner taps, inner or not (branch-free, so
    // the loads of all kPx pixels are in flight together); a pixel that is not inner reads from
    // offset 0, and on a 1-pixel-wide or -high image its second tap must stay there too.
    const int dx = W > 1 ? sx : 0, dy = H > 1 ? sy : 0;
    const double* M = p.matrices + b * 6;
    out_t* out_image = out + b * C * p.OH * p.OW;

    for (int tile = blockIdx.x; tile < tiles_per_image; tile += gridDim.x) {
      const int x0 = (tile % tiles_x) * kTileW + lx, y = (tile / tiles_x) * kTileH + ly;
      if (x0 >= OW || y >= OH) continue;
      const int npx = min(kPx, (OW - x0 + kPatchW - 1) / kPatchW);  // pixels x0 + 8k inside

      // This thread's pixels. Bit k of `inner`: pixel k is bilinear or nearest and all its taps lie
      // inside the image (almost all pixels); it reads from element offset off[k] with weights
      // (fx[k], fy[k]) and no border logic. Other pixels take sample_edge / sample_general.
      int off[kPx];
      acc_t fx[kPx], fy[kPx];
      unsigned inner = 0;
      {
        const double m0 = __ldg(M), m3 = __ldg(M + 3);
        const double rx = row_term(__ldg(M + 1), __ldg(M + 2), y), ry = row_term(__ldg(M + 4), __ldg(M + 5), y);
        const int reach = interp == kBilinear ? 1 : 0;  // last tap - first tap
#pragma unroll
        for (int k = 0; k < kPx; ++k) {
          const int x = x0 + kPatchW * k;
          const Taps<acc_t> t =
              make_taps(source_coord(m0, rx, x, acc_t()), source_coord(m3, ry, x, acc_t()), interp);
          const bool in = interp != kBicubic && t.valid && t.x0 >= 0 && t.x0 + reach < W && t.y0 >= 0 &&
                          t.y0 + reach < H;
          inner |= unsigned(in) << k;
          off[k] = in ? static_cast<int>(t.y0) * sy + static_cast<int>(t.x0) * sx : 0;
          fx[k] = t.fx;
          fy[k] = t.fy;
        }
      }
      const unsigned edge = ~inner & ((1u << npx) - 1u);  // pixels for the border-aware samplers

      for (int c = 0; c < C; ++c) {
        const int cs = static_cast<int>(p.transform.source_channel(c, C));
        const in_t* plane = src + cs * sc;
        acc_t v[kPx];
        if (interp == kNearest) {
#pragma unroll
          for (int k = 0; k < kPx; ++k) v[k] = load_acc<acc_t>(plane + off[k]);
        } else if (interp == kBilinear) {
#pragma unroll
          for (int k = 0; k < kPx; ++k) v[k] = bilinear_inner(plane + off[k], dx, dy, fx[k], fy[k]);
        }
        if (edge) {
          const acc_t bval = border_value<acc_t, in_t>(p.border_values, cs);
#pragma unroll
          for (int k = 0; k < kPx; ++k) {
            if (!(edge >> k & 1u)) continue;
            if constexpr (kInterp == kBilinear || kInterp == kNearest) {
              v[k] = sample_edge<kInterp>(M, x0 + kPatchW * k, y, plane, sx, sy, H, W, p.border, bval);
            } else {
              v[k] = sample_general(M, x0 + kPatchW * k, y, interp, plane, sx, sy, H, W, p.border, bval);
            }
          }
        }
        out_t* o = p.out_channels_last ? out_image + (static_cast<int64_t>(y) * OW + x0) * C + c
                                       : out_image + static_cast<int64_t>(c * OH + y) * OW + x0;
        const int o_step = p.out_channels_last ? kPatchW * C : kPatchW;
#pragma unroll
        for (int k = 0; k < kPx; ++k) {
          if (k < npx) o[k * o_step] = Store<out_t, acc_t>::cast(p.transform.apply(v[k], c));
        }
      }
    }
  }
}

// Launches a forward kernel over all output tiles of the batch (out_t from the kernel's type).
template <typename out_t>
void launch_tiles(void (*kernel)(ForwardParams, out_t*, int, int), const ForwardParams& p, at::Tensor& out) {
  const int tiles_x = static_cast<int>((p.OW + kTileW - 1) / kTileW);
  const int tiles = tiles_x * static_cast<int>((p.OH + kTileH - 1) / kTileH);  // < 2^31 / kTileW
  const dim3 grid(static_cast<unsigned>(std::min(tiles, 1 << 30)),
                  static_cast<unsigned>(std::min<int64_t>(p.B, 65535)));
  kernel<<<grid, kThreads, 0, current_stream()>>>(p, out.data_ptr<out_t>(), tiles_x, tiles);
  ORBBEC_LAUNCH_CHECK();
}

// Blocks per SM the register budget is cut for: 5 (51 registers) for the inline bilinear and
// nearest paths (faster than 4 or 6); 4 where the out-of-line general sampler's call would spill more.
template <typename in_t, typename out_t>
void launch_forward(const ForwardParams& p, at::Tensor& out) {
  if constexpr (std::is_same<in_t, uint8_t>::value) {
    switch (p.interp) {
      case kNearest: return launch_tiles(warp_forward_kernel<in_t, out_t, kNearest, 5>, p, out);
      case kBilinear:
        if (p.C == 3) {
          return launch_c3<out_t>(p, out);
        }
        return launch_tiles(warp_forward_kernel<in_t, out_t, kBilinear, 5>, p, out);
      default: return launch_tiles(warp_forward_kernel<in_t, out_t, kBicubic, 4>, p, out);
    }
  } else {
    launch_tiles(warp_forward_kernel<in_t, out_t, -1, 4>, p, out);
  }
}

// Runs the forward kernel for input type in_t into `out`, whose dtype picks out_t: the input's
// own type for a plain warp, or the fused output types.
template <typename in_t>
void launch_fused(const ForwardParams& p, at::Tensor& out) {
  if constexpr (std::is_same<in_t, double>::value) {
    if (out.scalar_type() == at::kDouble) return launch_forward<in_t, double>(p, out);
  }
  switch (out.scalar_type()) {
    case at::kFloat: launch_forward<in_t, float>(p, out); break;
    case at::kHalf: launch_forward<in_t, at::Half>(p, out); break;
    case at::kBFloat16: launch_forward<in_t, at::BFloat16>(p, out); break;
    case at::kByte: launch_forward<in_t, uint8_t>(p, out); break;
    default: TORCH_INTERNAL_ASSERT(false, "out_dtype was checked");
  }
}

}  // namespace forward_cuda
}  // namespace warpaffine
}  // namespace orbbec

// Explicit instantiations live in forward_<type>.cu; other files only declare them.
#define ORBBEC_WARP_FORWARD_TYPES(X) X(uint8_t) X(at::Half) X(at::BFloat16) X(float) X(double)
#define ORBBEC_WARP_FORWARD_EXTERN(T)                                                      \
  extern template void orbbec::warpaffine::forward_cuda::launch_fused<T>(                          \
      const orbbec::warpaffine::forward_cuda::ForwardParams&, at::Tensor&);
#define ORBBEC_WARP_FORWARD_INSTANTIATE(T)                                                 \
  template void orbbec::warpaffine::forward_cuda::launch_fused<T>(                                 \
      const orbbec::warpaffine::forward_cuda::ForwardParams&, at::Tensor&);
