// The forward warp kernel of warp_affine, included by one small .cu file per input type
// (forward_<type>.cu) so that nvcc compiles the instantiations in parallel.
//
// A direct gather: each thread computes a short row segment of output pixels, reads its taps
// straight from global memory (the read-only cache and L2 absorb the overlap between neighbours)
// and writes the segment with one vector store per channel where the layout allows. A first
// version staged each tile's input footprint in shared memory; it needed ~200 registers per
// thread and ran several times slower on an H100. The arithmetic is the shared code of
// common/warpaffine.h, so CPU and CUDA agree bit for bit.
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "common/src/cuda_utils.cuh"
#include "warpaffine/src/warpaffine_ext.h"

namespace orbbec {
namespace warpaffine {
namespace forward_cuda {

template <typename scalar_t>
using acc_type = typename std::conditional<std::is_same<scalar_t, double>::value, double, float>::type;

constexpr int kThreads = 256;

// Forward thread layout. A warp covers 32 x 4 output pixels as kPx = 4 patches of 8 x 4; thread
// (lx, ly) of the warp computes pixel (lx + 8k, ly) of patch k, all channels. One load
// instruction of the warp thus gathers the taps of a compact 8 x 4 patch, which under any
// rotation fall in a few input rows (sectors); with each thread taking 4 consecutive pixels
// instead, one instruction spanned 32 x 4 pixels and touched several times more sectors. Stores
// of a patch row are 8 consecutive elements, which the memory system merges. A block of 8 warps
// covers a 32 x 32 output tile; blocks of one image are neighbours in the grid, so the input they
// share stays in L2.
constexpr int kPx = 4, kPatchW = 8, kPatchH = 32 / kPatchW;
constexpr int kTileW = kPatchW * kPx, kTileH = kPatchH * (kThreads / 32);

// One input image: contiguous NCHW (planes of H x W) or NHWC (rows of W x C).
struct ImageDesc {
  const unsigned char* data;
  int64_t H, W;
};

struct ForwardParams {
  const ImageDesc* images;    // a list input: one per image, in device memory; nullptr for a batch
  const unsigned char* base;  // a batch tensor: image b starts at base + b * image_bytes
  int64_t image_bytes;
  int64_t B, C, H, W, OH, OW;
  bool in_channels_last, out_channels_last;
  int64_t interp, border;
  BorderValues bv;
  OutputTransform ot;
};

// Read-only loads through the non-coherent cache where the type has an __ldg overload.
template <typename T>
__device__ __forceinline__ T ro_load(const T* p) { return *p; }
template <>
__device__ __forceinline__ uint8_t ro_load(const uint8_t* p) { return __ldg(p); }
template <>
__device__ __forceinline__ float ro_load(const float* p) { return __ldg(p); }
template <>
__device__ __forceinline__ double ro_load(const double* p) { return __ldg(p); }

// An image value as the accumulator type. uint8 on the GPU goes through the float 2^23 + b bit
// trick (exact): the integer-to-float unit runs at a quarter of the FP32 rate, and every output
// pixel converts 4 taps per channel.
template <typename acc_t, typename in_t>
__device__ __forceinline__ acc_t load_acc(const in_t* p) { return static_cast<acc_t>(ro_load(p)); }
template <>
__device__ __forceinline__ float load_acc<float, uint8_t>(const uint8_t* p) {
  return __fsub_rn(__uint_as_float(0x4B000000u | __ldg(p)), 8388608.0f);
}

// Bicubic pixels and pixels of non-uint8 images (interpolation not a template constant) that have
// a tap outside the image: the general sampler of the shared header. It recomputes the pixel's
// taps from the matrix, so the kernel keeps only what the inner path needs in registers. Out of
// line: inlined, its 64-bit border arithmetic raised the kernel's registers for every pixel.
template <typename in_t, typename acc_t>
__device__ __noinline__ acc_t sample_general(const double* M, int64_t x, int64_t y, int64_t interp,
                                             const in_t* plane, int64_t sx, int64_t sy, int64_t H, int64_t W,
                                             int64_t border, acc_t bval) {
  const Taps<acc_t> t = make_taps(source_coord(__ldg(M), row_term(__ldg(M + 1), __ldg(M + 2), y), x, acc_t()),
                                  source_coord(__ldg(M + 3), row_term(__ldg(M + 4), __ldg(M + 5), y), x, acc_t()),
                                  interp);
  auto fetch = [&](int64_t ix, int64_t iy) -> acc_t { return static_cast<acc_t>(ro_load(plane + iy * sy + ix * sx)); };
  return sample(t, H, W, border, bval, fetch);
}

// The same for bilinear and nearest pixels with a template-constant interpolation, inline and in
// 32 bits (a call costs the whole kernel registers: 128 with it, 54 without). Same arithmetic as
// sample(): in-image taps are read, outside ones follow the border mode.
template <int kInterp, typename in_t, typename acc_t>
__device__ __forceinline__ acc_t sample_edge(const double* M, int x, int y, const in_t* plane, int sx, int sy,
                                             int H, int W, int64_t border, acc_t bval) {
  const Taps<acc_t> t = make_taps(source_coord(__ldg(M), row_term(__ldg(M + 1), __ldg(M + 2), y), x, acc_t()),
                                  source_coord(__ldg(M + 3), row_term(__ldg(M + 4), __ldg(M + 5), y), x, acc_t()),
                                  kInterp);
  if (!t.valid) return bval;
  auto at = [&](int ix, int iy) -> acc_t {
    if (ix < 0 || ix >= W || iy < 0 || iy >= H) {
      if (border == kConstant) return bval;
      ix = border_index(ix, W, border);
      iy = border_index(iy, H, border);
    }
    return load_acc<acc_t>(plane + iy * sy + ix * sx);
  };
  const int x0 = static_cast<int>(t.x0), y0 = static_cast<int>(t.y0);
  if (kInterp == kNearest) return at(x0, y0);
  return blend_bilinear(at(x0, y0), at(x0 + 1, y0), at(x0, y0 + 1), at(x0 + 1, y0 + 1), t.fx, t.fy);
}

// kInterp: the interpolation as a template constant (uint8 input, the hot path), or -1 to read it
// from the parameters (other input types, which keeps the number of instantiations down).
// Tap offsets inside one input image are 32-bit (the host checks each input image holds fewer
// than 2^31 elements): 64-bit tap arithmetic doubled the registers and halved the occupancy.
// The kernel is latency-bound on its gathers: occupancy pays (see kMinBlocks).
// Output addresses are formed with one 64-bit multiply per row, so outputs of any size work.
template <typename in_t, typename out_t, int kInterp, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    warp_forward_kernel(const ForwardParams p, out_t* __restrict__ out, const double* __restrict__ mats,
                        int tiles_x, int tiles_per_image) {
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
    const double* M = mats + b * 6;
    out_t* out_image = out + b * C * p.OH * p.OW;

    for (int tile = blockIdx.x; tile < tiles_per_image; tile += gridDim.x) {
      const int x0 = (tile % tiles_x) * kTileW + lx, y = (tile / tiles_x) * kTileH + ly;
      if (x0 >= OW || y >= OH) continue;
      const int npx = min(kPx, (OW - x0 + kPatchW - 1) / kPatchW);  // pixels x0 + 8k inside

      // This thread's pixels. Bit k of `inner`: pixel k is bilinear or nearest and all its taps lie
      // inside the image (almost all pixels); it reads from element offset off[k] with weights
      // (fx[k], fy[k]) and no border logic. Other pixels take sample_general.
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

      for (int c = 0; c < C; ++c) {
        const int cs = static_cast<int>(p.ot.source_channel(c, C));
        const in_t* plane = src + cs * sc;
        out_t* o = p.out_channels_last ? out_image + (static_cast<int64_t>(y) * OW + x0) * C + c
                                       : out_image + static_cast<int64_t>(c * OH + y) * OW + x0;
        const int o_step = p.out_channels_last ? kPatchW * C : kPatchW;
#pragma unroll
        for (int k = 0; k < kPx; ++k) {
          if (k >= npx) break;
          acc_t v;
          const in_t* q = plane + off[k];
          if ((inner >> k & 1u) && interp == kNearest) {
            v = load_acc<acc_t>(q);
          } else if (inner >> k & 1u) {
            v = blend_bilinear(load_acc<acc_t>(q), load_acc<acc_t>(q + sx), load_acc<acc_t>(q + sy),
                               load_acc<acc_t>(q + sy + sx), fx[k], fy[k]);
          } else {
            const acc_t bval = static_cast<acc_t>(Store<in_t, double>::cast(p.bv[cs]));
            if constexpr (kInterp == kBilinear || kInterp == kNearest) {
              v = sample_edge<kInterp>(M, x0 + kPatchW * k, y, plane, sx, sy, H, W, p.border, bval);
            } else {
              v = sample_general(M, x0 + kPatchW * k, y, interp, plane, sx, sy, H, W, p.border, bval);
            }
          }
          o[k * o_step] = Store<out_t, acc_t>::cast(p.ot.apply(v, c));
        }
      }
    }
  }
}

// Blocks per SM the register budget is cut for: 5 (51 registers) for the inline bilinear and
// nearest paths, measured on the H100 against 4 and 6 (face 0.160 ms vs 0.191 and 0.184); 4 where
// the out-of-line general sampler's call would spill more.
template <typename in_t, typename out_t, int kInterp,
          int kMinBlocks = (kInterp == kBilinear || kInterp == kNearest) ? 5 : 4>
void launch_forward_interp(const ForwardParams& p, at::Tensor& out, const at::Tensor& mat) {
  const int tiles_x = static_cast<int>((p.OW + kTileW - 1) / kTileW);
  const int tiles = tiles_x * static_cast<int>((p.OH + kTileH - 1) / kTileH);  // < 2^31 / kTileW
  const dim3 grid(static_cast<unsigned>(std::min(tiles, 1 << 30)),
                  static_cast<unsigned>(std::min<int64_t>(p.B, 65535)));
  warp_forward_kernel<in_t, out_t, kInterp, kMinBlocks><<<grid, kThreads, 0, current_stream()>>>(
      p, out.data_ptr<out_t>(), mat.data_ptr<double>(), tiles_x, tiles);
  ORBBEC_LAUNCH_CHECK();
}

template <typename in_t, typename out_t>
void launch_forward(const ForwardParams& p, at::Tensor& out, const at::Tensor& mat) {
  if constexpr (std::is_same<in_t, uint8_t>::value) {
    switch (p.interp) {
      case kNearest: return launch_forward_interp<in_t, out_t, kNearest>(p, out, mat);
      case kBilinear:
        return launch_forward_interp<in_t, out_t, kBilinear>(p, out, mat);
      default: return launch_forward_interp<in_t, out_t, kBicubic>(p, out, mat);
    }
  } else {
    launch_forward_interp<in_t, out_t, -1>(p, out, mat);
  }
}

// Runs the forward kernel for input type in_t into `out`, whose dtype picks out_t: the input's
// own type for a plain warp, or the fused output types.
template <typename in_t>
void launch_fused(const ForwardParams& p, at::Tensor& out, const at::Tensor& mat) {
  if constexpr (std::is_same<in_t, double>::value) {
    if (out.scalar_type() == at::kDouble) return launch_forward<in_t, double>(p, out, mat);
  }
  switch (out.scalar_type()) {
    case at::kFloat: launch_forward<in_t, float>(p, out, mat); break;
    case at::kHalf: launch_forward<in_t, at::Half>(p, out, mat); break;
    case at::kBFloat16: launch_forward<in_t, at::BFloat16>(p, out, mat); break;
    case at::kByte: launch_forward<in_t, uint8_t>(p, out, mat); break;
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
      const orbbec::warpaffine::forward_cuda::ForwardParams&, at::Tensor&, const at::Tensor&);
#define ORBBEC_WARP_FORWARD_INSTANTIATE(T)                                                 \
  template void orbbec::warpaffine::forward_cuda::launch_fused<T>(                                 \
      const orbbec::warpaffine::forward_cuda::ForwardParams&, at::Tensor&, const at::Tensor&);
