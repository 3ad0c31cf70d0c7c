// The forward warp kernel for 3-channel uint8 bilinear images (decoded photos, the common case).
#pragma once
#include "warpaffine/src/cuda/forward_common.cuh"

namespace orbbec {
namespace warpaffine {
namespace forward_cuda {

// 3-channel uint8 bilinear images, pixel by pixel. Profiled with ncu on the H100 (det workload),
// the general kernel issued 3 instructions per cycle of 4 and kept L1 80% busy, a quarter of that
// traffic register spills, while DRAM was 10% busy; so this path is written for few
// instructions, few loads and no spills (5 blocks of 256 threads per SM, 48 registers):
// - one pixel's 12 taps are in flight together, and only that pixel's position is live (the
//   general kernel keeps kPx positions across its channel loop, which cost spills);
// - channel and column steps are compile-time constants, so taps are addressed as a row pointer
//   plus an immediate offset instead of a 64-bit add per tap;
// - NHWC rows are read as aligned 32-bit words (2 or 3 per tap row instead of 6 byte loads).
// The arithmetic is the shared header's, so the results are those of the general path bit for bit.

// The 6 bytes q[0..5] of an NHWC tap row (pixels x0 and x0 + 1, 3 channels) as floats. Aligned
// words never cross a 4-byte boundary past q[5], so they stay in the allocation holding q.
__device__ __forceinline__ void load_nhwc_c3_row(const uint8_t* q, float v[6]) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(q);
  const unsigned* w = reinterpret_cast<const unsigned*>(addr & ~uintptr_t(3));
  const unsigned shift = 8u * static_cast<unsigned>(addr & 3u);
  const unsigned w0 = __ldg(w), w1 = __ldg(w + 1);
  const unsigned w2 = shift > 16u ? __ldg(w + 2) : 0u;  // q[5] is in the third word only then
  const unsigned lo = __funnelshift_r(w0, w1, shift), hi = __funnelshift_r(w1, w2, shift);
  // 0x4B0000bb is the float 2^23 + bb: the exact conversion of load_acc
  v[0] = __fsub_rn(__uint_as_float(__byte_perm(lo, 0x4B00u, 0x5440u)), 8388608.0f);
  v[1] = __fsub_rn(__uint_as_float(__byte_perm(lo, 0x4B00u, 0x5441u)), 8388608.0f);
  v[2] = __fsub_rn(__uint_as_float(__byte_perm(lo, 0x4B00u, 0x5442u)), 8388608.0f);
  v[3] = __fsub_rn(__uint_as_float(__byte_perm(lo, 0x4B00u, 0x5443u)), 8388608.0f);
  v[4] = __fsub_rn(__uint_as_float(__byte_perm(hi, 0x4B00u, 0x5440u)), 8388608.0f);
  v[5] = __fsub_rn(__uint_as_float(__byte_perm(hi, 0x4B00u, 0x5441u)), 8388608.0f);
}

template <bool kNHWC, typename out_t>
__global__ void __launch_bounds__(kThreads, 5)
    warp_c3_kernel(const ForwardParams p, out_t* __restrict__ out, const double* __restrict__ mats, int tiles_x,
                   int tiles_per_image) {
  constexpr int sx = kNHWC ? 3 : 1;
  const int OH = static_cast<int>(p.OH), OW = static_cast<int>(p.OW);
  const int lane = threadIdx.x % 32;
  const int lx = lane % kPatchW, ly = (threadIdx.x / 32) * kPatchH + lane / kPatchW;
  const bool reverse = p.ot.reverse_channels;
  for (int64_t b = blockIdx.y; b < p.B; b += gridDim.y) {
    const ImageDesc im = p.images ? p.images[b] : ImageDesc{p.base + b * p.image_bytes, p.H, p.W};
    const uint8_t* src = im.data;
    const int H = static_cast<int>(im.H), W = static_cast<int>(im.W);
    const int sy = W * sx, sc = kNHWC ? 1 : H * W;
    const double* M = mats + b * 6;
    for (int tile = blockIdx.x; tile < tiles_per_image; tile += gridDim.x) {
      const int x0 = (tile % tiles_x) * kTileW + lx, y = (tile / tiles_x) * kTileH + ly;
      if (x0 >= OW || y >= OH) continue;
      const int npx = min(kPx, (OW - x0 + kPatchW - 1) / kPatchW);
      const double m0 = round_to_float(__ldg(M)), m3 = round_to_float(__ldg(M + 3));
      const double rx = round_to_float(row_term(__ldg(M + 1), __ldg(M + 2), y));
      const double ry = round_to_float(row_term(__ldg(M + 4), __ldg(M + 5), y));
      out_t* o = p.out_channels_last ? out + ((b * p.OH + y) * p.OW + x0) * 3 : out + (b * 3 * p.OH + y) * p.OW + x0;
      const int o_step = p.out_channels_last ? kPatchW * 3 : kPatchW;
      const int64_t o_c = p.out_channels_last ? 1 : p.OH * p.OW;
      double xd = x0;  // exact; stepping it saves a 64-bit conversion per pixel
      // Pixels with a tap outside the image are left for a second loop: the border arithmetic
      // inside this one made the compiler spill the loop's state around it.
      unsigned edge = 0;
#pragma unroll 1
      for (int k = 0; k < npx; ++k, xd += kPatchW) {
        const Taps<float> t = make_taps(source_coord_rounded(m0, rx, xd), source_coord_rounded(m3, ry, xd), kBilinear);
        if (!(t.valid && t.x0 >= 0 && t.x0 + 1 < W && t.y0 >= 0 && t.y0 + 1 < H)) {
          edge |= 1u << k;
          continue;
        }
        float v[3];
        const uint8_t* q = src + (t.y0 * sy + t.x0 * sx);
        if constexpr (kNHWC) {
          float r0[6], r1[6];
          load_nhwc_c3_row(q, r0);
          load_nhwc_c3_row(q + sy, r1);
#pragma unroll
          for (int c = 0; c < 3; ++c) v[c] = blend_bilinear(r0[c], r0[c + 3], r1[c], r1[c + 3], t.fx, t.fy);
        } else {
#pragma unroll
          for (int c = 0; c < 3; ++c) v[c] = bilinear_inner(q + c * sc, sx, sy, t.fx, t.fy);
        }
#pragma unroll
        for (int c = 0; c < 3; ++c) {
          o[k * o_step + c * o_c] = Store<out_t, float>::cast(p.ot.apply(reverse ? v[2 - c] : v[c], c));
        }
      }
      for (int k = 0; edge; ++k, edge >>= 1) {
        if (!(edge & 1u)) continue;
        // taps from the matrix again: keeping the loop's coordinates alive for this loop cost spills
        const Taps<float> t = taps_from_matrix<float>(M, x0 + kPatchW * k, y, kBilinear);
#pragma unroll
        for (int c = 0; c < 3; ++c) {
          const int cs = reverse ? 2 - c : c;
          const float bval = static_cast<float>(Store<uint8_t, double>::cast(p.bv[cs]));
          const float v = sample_plane(t, src + cs * sc, sx, sy, H, W, p.border, bval);
          o[k * o_step + c * o_c] = Store<out_t, float>::cast(p.ot.apply(v, c));
        }
      }
    }
  }
}

}  // namespace forward_cuda
}  // namespace warpaffine
}  // namespace orbbec
