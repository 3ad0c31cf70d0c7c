// The forward warp kernel for 3-channel uint8 bilinear images (decoded photos, the common case).
#pragma once
#include "warpaffine/src/cuda/forward_common.cuh"

namespace orbbec {
namespace warpaffine {
namespace forward_cuda {

// 3-channel uint8 bilinear images, pixel by pixel. The kernel is bound by the instructions it
// issues and by L1 (ncu on the H100, det workload, uint8 NCHW / NHWC: issue slots 69% / 75% busy,
// L1 95% / 85%), so it is written for few instructions and few load requests:
// - a thread computes kC3Px = 8 pixels of a row (x0 + 16k), so the set-up of a tile (image,
//   matrix, row terms, output address) is paid once per 8 pixels; the grid is 3-D (tile column,
//   tile row, image): no division to find a tile;
// - a pixel whose taps all lie in the image takes the inner path: channel and column steps are
//   compile-time constants (a row pointer plus immediate offsets), tap rows are read as aligned
//   32-bit words (NHWC: 2 or 3 per row instead of 6 byte loads; NCHW: 1, or 2 in a quarter of the
//   cases, instead of 2 byte loads), one pixel's taps in flight together;
// - with a constant border, a pixel whose taps all lie outside is the border value (the blend of
//   four equal values is that value), written at once; on the det workload they are 14% of the
//   pixels, and sending them through the border-aware sampler cost a quarter of the instructions;
// - the rest (a pixel wide rim, other border modes) goes through a second loop: its border
//   arithmetic inside the first loop made the compiler spill the loop's state. A constant border's
//   rim tests its 4 taps once for the 3 channels; other modes take the shared sampler.
// Coordinates and blending are the shared header's, so results are the general path's bit for bit.

// A warp covers a patch of 16 x 2 output pixels per step (kC3PatchW x kC3PatchH), and a thread
// computes kC3Px = 8 pixels of a row, 16 apart: a block covers 128 x 16 output pixels. H100 ncu,
// NCHW / NHWC, against 8 x 4 patches: face 90.5 / 73.3 -> 87.5 / 72.7 us, det 269.5 / 197.5 ->
// 234.2 / 194.3 us, hd 108.2 / 73.1 -> 91.6 / 70.4 us (with the shared plane window below; 32 x 1
// was slower on face and det). A patch row of 16 spans more banks of a 128-byte line, so a load
// instruction's lanes conflict less (det rows are 640 bytes, a whole number of lines: the 4 rows
// of an 8 x 4 patch landed on the same banks). 8 pixels per thread measured faster than 16 with 8 x 4
// patches (det NHWC 0.202 vs 0.216 ms, face NCHW 0.127 vs 0.145 ms: fewer blocks left the last
// wave short).
constexpr int kC3PatchW = 16, kC3PatchH = 32 / kC3PatchW, kC3TileH = kC3PatchH * (kThreads / 32);
constexpr int kC3Px = 8, kC3TileW = kC3PatchW * kC3Px;
// Blocks per SM the kernel's registers are cut for (48 per thread); launch_c3 sizes its grid by it.
constexpr int kC3BlocksPerSM = 5;

// uint8 taps are handled as the floats 2^23 + b ("biased": 0x4B0000bb, an exact conversion
// without the slow integer-to-float unit; biased_byte below). A difference of two biased taps is
// exact, so blend_bilinear's arithmetic needs only its two base taps unbiased: bit for bit the
// same result with 6 fewer instructions per pixel.
__device__ __forceinline__ float blend_biased(float b00, float b01, float b10, float b11, float fx, float fy) {
  const float p00 = __fsub_rn(b00, 8388608.0f), p10 = __fsub_rn(b10, 8388608.0f);
  const float v0 = __fadd_rn(p00, __fmul_rn(fx, __fsub_rn(b01, b00)));
  const float v1 = __fadd_rn(p10, __fmul_rn(fx, __fsub_rn(b11, b10)));
  return __fadd_rn(v0, __fmul_rn(fy, __fsub_rn(v1, v0)));
}

// The aligned 32-bit word holding q[0], and the right shift that brings q[0] to its low byte.
// Words read from there never cross a 4-byte boundary past the last byte wanted, so they stay in
// the allocation holding it.
struct WordWindow {
  const unsigned* w;
  unsigned shift;
  __device__ __forceinline__ explicit WordWindow(const uint8_t* q)
      : w(reinterpret_cast<const unsigned*>(reinterpret_cast<uintptr_t>(q) & ~uintptr_t(3))),
        shift(8u * static_cast<unsigned>(reinterpret_cast<uintptr_t>(q) & 3u)) {}
};
// Byte i of word v, biased.
template <int i>
__device__ __forceinline__ float biased_byte(unsigned v) { return __uint_as_float(__byte_perm(v, 0x4B00u, 0x5440u + i)); }

// q[0], q[1] (an NCHW tap pair), biased, from the aligned word holding q[0] and the next word only
// when q[1] is in it (1 in 4). Half the load requests of two byte loads: NCHW was bound by L1 (96%
// busy on det); measured on the H100, det / hd NCHW 0.255 / 0.112 ms against 0.299 / 0.144 ms.
// The pair at word offset `words` from the window (another channel plane of the same alignment).
__device__ __forceinline__ void load_pair_biased(const WordWindow& ww, int words, float& a, float& b) {
  const unsigned w0 = __ldg(ww.w + words);
  const unsigned w1 = ww.shift == 24u ? __ldg(ww.w + words + 1) : 0u;
  const unsigned lo = __funnelshift_r(w0, w1, ww.shift);
  a = biased_byte<0>(lo);
  b = biased_byte<1>(lo);
}

// The 6 bytes q[0..5] of an NHWC tap row (pixels x0 and x0 + 1, 3 channels), biased, from 2 aligned
// words, or 3 when q[5] is in the third.
__device__ __forceinline__ void load_nhwc_c3_row(const uint8_t* q, float v[6]) {
  const WordWindow ww(q);
  const unsigned w0 = __ldg(ww.w), w1 = __ldg(ww.w + 1);
  const unsigned w2 = ww.shift > 16u ? __ldg(ww.w + 2) : 0u;
  const unsigned lo = __funnelshift_r(w0, w1, ww.shift), hi = __funnelshift_r(w1, w2, ww.shift);
  v[0] = biased_byte<0>(lo);
  v[1] = biased_byte<1>(lo);
  v[2] = biased_byte<2>(lo);
  v[3] = biased_byte<3>(lo);
  v[4] = biased_byte<0>(hi);
  v[5] = biased_byte<1>(hi);
}

// Channel c of the output, from sampled value v. kNormalize: the fused transform's normalisation
// as a template constant (a runtime branch around its division cost the plain warp 8 instructions
// per pixel).
template <typename out_t, bool kNormalize>
__device__ __forceinline__ out_t c3_output(const OutputTransform& ot, float v, int c) {
  return Store<out_t, float>::cast(kNormalize ? ot.normalized(v, c) : v);
}
// The same for a pixel of the inner path. A uint8 warp skips Store's clamp there: each step of the
// blend keeps its value between the taps it mixes (rounding is monotone and the weights lie in
// [0, 1)), up to the rounding of the last difference, a few units in the last place, far less than
// the half level that would change the rounded byte. 6 instructions fewer per pixel.
template <typename out_t, bool kNormalize>
__device__ __forceinline__ out_t c3_inner_output(const OutputTransform& ot, float v, int c) {
  if constexpr (std::is_same<out_t, uint8_t>::value && !kNormalize) {
    return static_cast<uint8_t>(__float_as_uint(__fadd_rn(v, 8388608.0f)));
  } else {
    return c3_output<out_t, kNormalize>(ot, v, c);
  }
}

// Source coordinate of column x: source_coord_rounded as one double fma. m0_f holds a float and x
// an integer below 2^24, so their product is exact in double and the fma rounds once, like the
// shared header's multiply-then-add: the same bits, one instruction fewer per coordinate.
__device__ __forceinline__ float source_coord_fma(double m0_f, double row_term_f, double x) {
  return static_cast<float>(__fma_rn(m0_f, x, row_term_f));
}

// Outputs narrower than 4 bytes go through shared memory. Written straight from the pixel loop,
// each store instruction put 1 or 2 bytes per lane into 4 rows, and the 3 channels' stores hit
// the same sectors again: ncu (H100, det, uint8) counted 6 times the ideal L2 store sectors and
// L2 84% busy. A warp instead leaves its 2 x 128 pixels in a stage laid out like the output, then
// copies each contiguous run out in 32-bit words.
// Runs of the stage (see copy_stage) start 16 words (64 bytes) after the previous run's end: at a
// whole number of 128-byte lines apart, a store or copy instruction's two rows hit the same banks
// (H100 ncu, NCHW / NHWC: face 86.7 / 72.4 -> 86.4 / 70.8 us, det 234.6 / 195.7 -> 231.2 / 193.8,
// hd 92.6 / 70.4 -> 89.3 / 69.9).
template <typename out_t, int kTileW>
struct C3Stage {
  static constexpr bool kUsed = sizeof(out_t) < 4;
  static constexpr int kPad = 64 / int(sizeof(out_t));
  static constexpr int kPitchNHWC = kTileW * 3 + kPad, kPitchNCHW = kTileW + kPad;  // values from run to run
  static constexpr int kWarpValues = std::max(3 * kC3PatchH * kPitchNCHW, kC3PatchH * kPitchNHWC);
};

// Copies one warp's stage to the output. The stage holds kRuns runs of kLen values, kPitch apart
// (a run: a row of the warp's 2 x 128 pixels, NHWC; a (channel, row) pair, NCHW); lane l copies
// run l / 16 of each run group, taking every 16th word from word l % 16, so its addresses are one
// row pointer plus constant offsets. dst(run) is nullptr for rows past the output's last. The
// first n values of each run go out as 32-bit words where the caller found every run word-aligned
// and n values a whole number of words (a partial tile too: face's 112-pixel rows end in a partial
// tile, which went out value by value), else value by value.
template <int kRuns, int kLen, int kPitch, typename out_t, typename Dst>
__device__ __forceinline__ void copy_stage(const out_t* stage, int n, bool words, int lane, const Dst& dst) {
  constexpr int kLanesPerRun = 32 / kC3PatchH;  // 16
  const int run0 = lane / kLanesPerRun, part = lane % kLanesPerRun;
  if (words) {
    constexpr int kWords = kLen * int(sizeof(out_t)) / 4;
    static_assert(kWords % kLanesPerRun == 0, "a run is a whole number of words per lane");
    const int n_words = n * int(sizeof(out_t)) / 4;
#pragma unroll
    for (int run = run0; run < kRuns; run += kC3PatchH) {
      unsigned* d = reinterpret_cast<unsigned*>(dst(run));
      const unsigned* s32 = reinterpret_cast<const unsigned*>(stage + run * kPitch);
      if (d) {
#pragma unroll
        for (int w = part; w < kWords; w += kLanesPerRun) {
          if (w < n_words) d[w] = s32[w];
        }
      }
    }
  } else {
    for (int run = run0; run < kRuns; run += kC3PatchH) {
      out_t* d = dst(run);
      if (d) {
        for (int j = part; j < n; j += kLanesPerRun) d[j] = stage[run * kPitch + j];
      }
    }
  }
}

template <bool kNHWC, bool kNormalize, typename out_t>
__global__ void __launch_bounds__(kThreads, kC3BlocksPerSM)
    warp_c3_kernel(const ForwardParams p, out_t* __restrict__ out, const double* __restrict__ mats) {
  using Stage = C3Stage<out_t, kC3TileW>;
  __shared__ __align__(16) out_t stage_all[Stage::kUsed ? kThreads / 32 * Stage::kWarpValues : 1];
  constexpr int sx = kNHWC ? 3 : 1;
  const int OH = static_cast<int>(p.OH), OW = static_cast<int>(p.OW);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int lx = lane % kC3PatchW;
  const bool constant_border = p.border == kConstant, ocl = p.out_channels_last;
  const int co0 = p.ot.reverse_channels ? 2 : 0, co2 = 2 - co0;  // output channels of sampled channels 0 and 2
  const int tiles_x = (OW + kC3TileW - 1) / kC3TileW, tiles_y = (OH + kC3TileH - 1) / kC3TileH;
  // Where this thread's pixel k, channel c goes: o[k * o_step + c * o_c] in the output, or
  // stage[s_px + k * o_step + c * s_c] in the warp's stage (the output's layout, 2 x 128 pixels).
  const int o_step = ocl ? kC3PatchW * 3 : kC3PatchW;
  const int64_t o_c = ocl ? 1 : p.OH * p.OW;
  out_t* stage = stage_all + (Stage::kUsed ? warp * Stage::kWarpValues : 0);
  const int s_row = lane / kC3PatchW;
  const int s_px = ocl ? s_row * Stage::kPitchNHWC + lx * 3 : s_row * Stage::kPitchNCHW + lx;
  const int s_c = ocl ? 1 : kC3PatchH * Stage::kPitchNCHW;
  for (int64_t b = blockIdx.z; b < p.B; b += gridDim.z) {
    const ImageDesc im = p.images ? p.images[b] : ImageDesc{p.base + b * p.image_bytes, p.H, p.W};
    const uint8_t* src = im.data;
    const int H = static_cast<int>(im.H), W = static_cast<int>(im.W);
    const int sy = W * sx, sc = kNHWC ? 1 : H * W, sc_words = sc / 4;
    const bool planes_aligned = sc % 4 == 0;
    const double* M = mats + b * 6;
    for (int ty = blockIdx.y; ty < tiles_y; ty += gridDim.y) {
      const int row0 = ty * kC3TileH + warp * kC3PatchH, y = row0 + s_row;  // row0: the warp's first row
      if (!Stage::kUsed && row0 >= OH) continue;  // the whole warp (with a stage, it takes part in the barriers)
      for (int tx = blockIdx.x; tx < tiles_x; tx += gridDim.x) {
        const int tile_x = tx * kC3TileW, x0 = tile_x + lx;
        // pixels x0 + 16k of this thread inside the output (0 for lanes past its edge, which still
        // take part in the warp's copy of the stage)
        const int npx = y < OH && x0 < OW ? min(kC3Px, (OW - x0 + kC3PatchW - 1) / kC3PatchW) : 0;
        out_t* o = out + (ocl ? ((b * p.OH + y) * p.OW + x0) * 3 : (b * 3 * p.OH + y) * p.OW + x0);
        auto store = [&](int k, int c, out_t value) {
          if constexpr (Stage::kUsed) {
            stage[s_px + k * o_step + c * s_c] = value;
          } else {
            o[k * o_step + c * o_c] = value;
          }
        };
        auto put = [&](int k, int c, float v) { store(k, c, c3_output<out_t, kNormalize>(p.ot, v, c)); };
        // the matrix terms, per tile: kept across the tile loop they took registers from the stage copy
        const double m0 = round_to_float(__ldg(M)), m3 = round_to_float(__ldg(M + 3));
        const double rx = round_to_float(row_term(__ldg(M + 1), __ldg(M + 2), y));
        const double ry = round_to_float(row_term(__ldg(M + 4), __ldg(M + 5), y));
        double xd = x0;  // exact; stepping it saves a 64-bit conversion per pixel
        unsigned edge = 0;  // pixels left for the border-aware sampler
#pragma unroll 1
        for (int k = 0; k < npx; ++k, xd += kC3PatchW) {
          const float sxf = source_coord_fma(m0, rx, xd), syf = source_coord_fma(m3, ry, xd);
          const bool valid = coord_ok(sxf) && coord_ok(syf);
          // floor (make_taps' floor_coord for the coordinates that pass coord_ok; others unused)
          const int ix = __float2int_rd(sxf), iy = __float2int_rd(syf);
          if (valid && static_cast<unsigned>(ix) < static_cast<unsigned>(W - 1) &&
              static_cast<unsigned>(iy) < static_cast<unsigned>(H - 1)) {
            const float fx = sxf - static_cast<float>(ix), fy = syf - static_cast<float>(iy);
            float v[3];
            const uint8_t* q = src + (iy * sy + ix * sx);
            if constexpr (kNHWC) {
              float r0[6], r1[6];
              load_nhwc_c3_row(q, r0);
              load_nhwc_c3_row(q + sy, r1);
#pragma unroll
              for (int c = 0; c < 3; ++c) v[c] = blend_biased(r0[c], r0[c + 3], r1[c], r1[c + 3], fx, fy);
            } else {
              // one channel: its tap pairs from the windows of rows iy and iy + 1, `words` further on
              auto blend_plane = [&](const WordWindow& row0, const WordWindow& row1, int words) {
                float b00, b01, b10, b11;
                load_pair_biased(row0, words, b00, b01);
                load_pair_biased(row1, words, b10, b11);
                return blend_biased(b00, b01, b10, b11, fx, fy);
              };
              if (planes_aligned) {
                // planes a whole number of words apart: the 3 channels' taps share one window per row
                // (H100 ncu, NCHW: face 92.7 -> 87.5 us, det 242.9 -> 234.2, hd 94.0 -> 91.6)
                const WordWindow r0(q), r1(q + sy);
#pragma unroll
                for (int c = 0; c < 3; ++c) v[c] = blend_plane(r0, r1, c * sc_words);
              } else {
#pragma unroll
                for (int c = 0; c < 3; ++c) v[c] = blend_plane(WordWindow(q + c * sc), WordWindow(q + c * sc + sy), 0);
              }
            }
            // sampled channel c goes to output channel c, or 2 - c reversed: the reversal picks store
            // offsets (hoisted out of the loop), not values (a select per channel and pixel)
            store(k, co0, c3_inner_output<out_t, kNormalize>(p.ot, v[0], co0));
            store(k, 1, c3_inner_output<out_t, kNormalize>(p.ot, v[1], 1));
            store(k, co2, c3_inner_output<out_t, kNormalize>(p.ot, v[2], co2));
          } else if (constant_border && (!valid || static_cast<unsigned>(ix + 1) > static_cast<unsigned>(W) ||
                                         static_cast<unsigned>(iy + 1) > static_cast<unsigned>(H))) {
#pragma unroll
            for (int c = 0; c < 3; ++c) put(k, c, p.c3_border[c]);
          } else {
            edge |= 1u << k;
          }
        }
        for (int k = 0; edge; ++k, edge >>= 1) {
          if (!(edge & 1u)) continue;
          // taps from the matrix again: keeping the loop's coordinates alive for this loop cost spills
          const Taps<float> t = taps_from_matrix<float>(M, x0 + kC3PatchW * k, y, kBilinear);
          if (constant_border) {
            // sample()'s constant-border bilinear case with the tap tests done once for the 3
            // channels instead of once per channel behind the runtime border switch: on face
            // (small outputs, a long rim for their area) this loop was 14% of the instructions;
            // H100 ncu, face NCHW / NHWC 107.5 / 90.7 -> 94.4 / 75.1 us, det 284 / 218 -> 274 / 203
            const bool in_x0 = static_cast<unsigned>(t.x0) < static_cast<unsigned>(W);
            const bool in_x1 = static_cast<unsigned>(t.x0 + 1) < static_cast<unsigned>(W);
            const bool in_y0 = static_cast<unsigned>(t.y0) < static_cast<unsigned>(H);
            const bool in_y1 = static_cast<unsigned>(t.y0 + 1) < static_cast<unsigned>(H);
            const int o00 = t.y0 * sy + t.x0 * sx;
#pragma unroll
            for (int c = 0; c < 3; ++c) {
              const int cs = static_cast<int>(p.ot.source_channel(c, 3));
              const float bval = p.c3_border[c];
              const uint8_t* plane = src + cs * sc;
              auto at = [&](bool in, int offset) { return in ? load_acc<float>(plane + (o00 + offset)) : bval; };
              put(k, c, t.valid ? blend_bilinear(at(in_x0 && in_y0, 0), at(in_x1 && in_y0, sx), at(in_x0 && in_y1, sy),
                                                 at(in_x1 && in_y1, sy + sx), t.fx, t.fy)
                                : bval);
            }
          } else {
#pragma unroll
            for (int c = 0; c < 3; ++c) {
              const int cs = static_cast<int>(p.ot.source_channel(c, 3));
              put(k, c, sample_plane(t, src + cs * sc, sx, sy, H, W, p.border, p.c3_border[c]));
            }
          }
        }
        if constexpr (Stage::kUsed) {
          // a block barrier, not __syncwarp: around a __syncwarp that it cannot prove converged,
          // the compiler kept every live value of the kernel safe, and spilled the pixel loop's
          __syncthreads();
          const int rows = min(kC3PatchH, OH - row0), cols = min(kC3TileW, OW - tile_x);
          out_t* first = out + (ocl ? ((b * p.OH + row0) * p.OW + tile_x) * 3 : (b * 3 * p.OH + row0) * p.OW + tile_x);
          const int64_t row_stride = ocl ? p.OW * 3 : p.OW;
          // whole words: every run starting on a 4-byte boundary and a whole number of words long
          const bool words = ((reinterpret_cast<uintptr_t>(first) | row_stride * sizeof(out_t) |
                               (ocl ? 0 : o_c * sizeof(out_t)) | cols * (ocl ? 3 : 1) * sizeof(out_t)) & 3) == 0;
          if (ocl) {  // runs: the warp's rows
            copy_stage<kC3PatchH, kC3TileW * 3, Stage::kPitchNHWC>(stage, cols * 3, words, lane, [&](int r) -> out_t* {
              return r < rows ? first + r * row_stride : nullptr;
            });
          } else {  // runs: (channel, row) pairs
            copy_stage<3 * kC3PatchH, kC3TileW, Stage::kPitchNCHW>(stage, cols, words, lane, [&](int i) -> out_t* {
              const int c = i / kC3PatchH, r = i % kC3PatchH;
              return r < rows ? first + c * o_c + r * row_stride : nullptr;
            });
          }
          __syncthreads();
        }
      }
    }
  }
}

// Launches the 3-channel kernel over a 3-D grid of (tile column, tile row, image).
template <typename out_t>
void launch_c3(const ForwardParams& p, at::Tensor& out, const at::Tensor& mat) {
  const int64_t tiles_x = (p.OW + kC3TileW - 1) / kC3TileW, tiles_y = (p.OH + kC3TileH - 1) / kC3TileH;
  // Rows of tiles per block: a block's set-up before its first tile (registers, addresses, about
  // 200 instructions per warp; ncu: 16% of det's instructions with one tile per block) is paid once
  // for up to 4 tiles, as long as 4 waves of blocks remain to balance the SMs (det: 4; face, hd: 1).
  const int64_t resident = int64_t(multiprocessor_count()) * kC3BlocksPerSM;
  const int64_t rows_per_block = std::max<int64_t>(1, std::min<int64_t>(4, tiles_x * tiles_y * p.B / (4 * resident)));
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(tiles_x, int64_t(1) << 30)),
                  static_cast<unsigned>(std::min<int64_t>((tiles_y + rows_per_block - 1) / rows_per_block, 65535)),
                  static_cast<unsigned>(std::min<int64_t>(p.B, 65535)));
  auto kernel = p.ot.normalize ? warp_c3_kernel<false, true, out_t> : warp_c3_kernel<false, false, out_t>;
  if (p.in_channels_last) kernel = p.ot.normalize ? warp_c3_kernel<true, true, out_t> : warp_c3_kernel<true, false, out_t>;
  // the border values the kernel writes, per output channel: the source channel's value saturated
  // to uint8 as cv2 does (Store's host version rounds like the device's), converted once here, not
  // per border pixel (H100 ncu, NCHW / NHWC: face 95.0 / 75.0 -> 90.5 / 73.3 us, det NHWC 201 -> 198)
  ForwardParams q = p;
  for (int c = 0; c < 3; ++c) q.c3_border[c] = border_value<float, uint8_t>(p.bv, p.ot.source_channel(c, 3));
  kernel<<<grid, kThreads, 0, current_stream()>>>(q, out.data_ptr<out_t>(), mat.data_ptr<double>());
  ORBBEC_LAUNCH_CHECK();
}

}  // namespace forward_cuda
}  // namespace warpaffine
}  // namespace orbbec
