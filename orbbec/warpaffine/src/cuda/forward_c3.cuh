// The forward warp kernel for 3-channel uint8 bilinear images (decoded photos, the common case).
#pragma once
#include "warpaffine/src/cuda/forward_common.cuh"

namespace orbbec {
namespace warpaffine {
namespace forward_cuda {

// 3-channel uint8 bilinear images, pixel by pixel. The kernel is bound by the instructions it
// issues (and was by L1 before the shear below), so it is written for few instructions and few
// load requests (docs/dev/warpaffine.md):
// - a warp's 32 lanes take 32 adjacent columns, sheared so that one load instruction reads along
//   one source row (below); a thread computes kC3Px = 4 pixels of each of kC3WarpRows = 2 rows,
//   so a row's terms are paid once per 4 pixels; the grid is 3-D (tile column, tile row, image):
//   no division to find a tile;
// - a pixel whose taps all lie in the image takes the inner path: channel and column steps are
//   compile-time constants (a row pointer plus immediate offsets), tap rows are read as aligned
//   32-bit words (NHWC: 2 or 3 per row instead of 6 byte loads; NCHW: 1, or 2 in a quarter of the
//   cases, instead of 2 byte loads), one pixel's taps in flight together;
// - with a constant border, a pixel whose taps all lie outside is the border value (the blend of
//   four equal values is that value), written at once (the border-aware sampler is expensive, and
//   rotated warps have many such pixels);
// - the rest (a pixel wide rim, other border modes) goes through a second loop: its border
//   arithmetic inside the first loop made the compiler spill the loop's state. A constant border's
//   rim tests its 4 taps once for the 3 channels; other modes take the shared sampler.
// Coordinates and blending are the shared header's, so results are the general path's bit for bit.

// The sheared mapping. A block covers a tile of 128 x 16 output pixels. At step (j, k), lane l of
// warp w computes column 32k + l of tile row (2w + j + shift_l) mod 16, shift_l = round(t * l), t
// the output slope along which the source row stays the same (c3_lane_shift): the 32 pixels of a
// step lie on one or two output lines that map to one source row each, so one load instruction
// reads one or two stretches of a source row (an axis-aligned patch reads across as many source
// rows as it rotates through, and L1 became the limit). Every column's rows are permuted, so each
// pixel is computed once whatever t is.
constexpr int kC3Lanes = 32, kC3WarpRows = 2, kC3TileH = kC3WarpRows * (kThreads / 32);
constexpr int kC3Px = 4, kC3TileW = kC3Lanes * kC3Px;
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
// when q[1] is in it (1 in 4): half the load requests of two byte loads.
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
__device__ __forceinline__ out_t c3_output(const OutputTransform& transform, float v, int c) {
  return Store<out_t, float>::cast(kNormalize ? transform.normalized(v, c) : v);
}
// The same for a pixel of the inner path. A uint8 warp skips Store's clamp there: each step of the
// blend keeps its value between the taps it mixes (rounding is monotone and the weights lie in
// [0, 1)), up to the rounding of the last difference, a few units in the last place, far less than
// the half level that would change the rounded byte. 6 instructions fewer per pixel.
template <typename out_t, bool kNormalize>
__device__ __forceinline__ out_t c3_inner_output(const OutputTransform& transform, float v, int c) {
  if constexpr (std::is_same<out_t, uint8_t>::value && !kNormalize) {
    return static_cast<uint8_t>(__float_as_uint(__fadd_rn(v, 8388608.0f)));
  } else {
    return c3_output<out_t, kNormalize>(transform, v, c);
  }
}

// Outputs go through shared memory. Written straight from the pixel loop, each store instruction
// of a sheared step would put its lanes' values into as many rows as the shear spans; before the
// shear, uint8 stores already put 1 byte per lane into 4 rows and the 3 channels hit the same
// sectors again (6 times the ideal L2 store sectors). The block
// instead leaves its tile in a stage laid out like the output, tile row r in region r / 2 (the
// region warp r / 2 copies out), and each warp copies its region's contiguous runs out in 32-bit
// words.
// The layout is chosen against shared-memory bank conflicts, per value size (each measured faster
// than the other's layout):
// - 4-byte values: runs unpadded, so every run starts on a 128-byte boundary. A sheared step's 32
//   stores (one column per lane, whatever their rows) then fall on 32 different banks, and a copy
//   instruction reads 32 consecutive words of one run.
// - 1- and 2-byte values: neighbouring lanes share words, so when two neighbours are in different
//   rows those rows must start 16 banks apart: runs are padded by 64 bytes (regions are whole
//   lines), and a copy instruction reads 16 words of each of 2 runs.
template <typename out_t, int kTileW>
struct C3Stage {
  static constexpr bool kNarrow = sizeof(out_t) < 4;
  static constexpr int kPad = kNarrow ? 64 / int(sizeof(out_t)) : 0;
  static constexpr int kPitchNHWC = kTileW * 3 + kPad, kPitchNCHW = kTileW + kPad;  // values from run to run
  static constexpr int kWarpValues = std::max(3 * kC3WarpRows * kPitchNCHW, kC3WarpRows * kPitchNHWC);
  static constexpr int kLanesPerRun = kNarrow ? 16 : 32;  // of a copy instruction
  static_assert(kWarpValues * sizeof(out_t) % 128 == 0, "regions are whole 128-byte lines");
};

// Copies one warp's region of the stage to the output. It holds kRuns runs of kLen values, kPitch
// apart (a run: a row of the region's 2 x 128 pixels, NHWC; a (channel, row) pair, NCHW); lane l
// copies run l / kLanesPerRun of each group of 32 / kLanesPerRun runs, taking every kLanesPerRun-th
// word from word l % kLanesPerRun, so its addresses are one row pointer plus constant offsets.
// dst(run) is nullptr for rows past the output's last. The first n values of each run go out as
// 32-bit words where the caller found every run word-aligned and n values a whole number of words
// (a partial tile too: face's 112-pixel rows end in a partial tile, which went out value by value),
// else value by value.
template <int kRuns, int kLen, int kPitch, int kLanesPerRun, typename out_t, typename Dst>
__device__ __forceinline__ void copy_stage(const out_t* stage, int n, bool words, int lane, const Dst& dst) {
  constexpr int kRunStep = 32 / kLanesPerRun;
  const int run0 = lane / kLanesPerRun, part = lane % kLanesPerRun;
  if (words) {
    constexpr int kWords = kLen * int(sizeof(out_t)) / 4;
    static_assert(kWords % kLanesPerRun == 0, "a run is a whole number of words per lane");
    const int n_words = n * int(sizeof(out_t)) / 4;
#pragma unroll
    for (int run = run0; run < kRuns; run += kRunStep) {
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
    for (int run = run0; run < kRuns; run += kRunStep) {
      out_t* d = dst(run);
      if (d) {
        for (int j = part; j < n; j += kLanesPerRun) d[j] = stage[run * kPitch + j];
      }
    }
  }
}

// The lane shift of the sheared mapping (see warp_c3_kernel): lane l's pixels sit
// round(t * l) rows further down the tile (mod kC3TileH), with t = -M[3] / M[4] the output slope
// along which the source row stays the same, so that one load instruction of a warp reads along
// one or two source rows. |t| is capped at 1 (steeper lines: a partial shear still helps); any
// shift is a permutation of each column's rows, so only speed depends on it.
__device__ __forceinline__ int c3_lane_shift(const double* M, int lane) {
  double t = -__ldg(M + 3) / __ldg(M + 4);
  t = fabs(t) <= 1.0 ? t : (t > 1.0 ? 1.0 : (t < -1.0 ? -1.0 : 0.0));  // NaN: no shear
  return static_cast<int>(floor(t * lane + 0.5)) & (kC3TileH - 1);
}

// The 3 channels of an inner pixel (all 4 taps inside) of an NHWC image, sampled channel order:
// the taps of rows iy and iy + 1 start at q and q + row_step.
__device__ __forceinline__ void blend_inner_nhwc(const uint8_t* q, int row_step, float fx, float fy, float v[3]) {
  float row0[6], row1[6];
  load_nhwc_c3_row(q, row0);
  load_nhwc_c3_row(q + row_step, row1);
#pragma unroll
  for (int c = 0; c < 3; ++c) v[c] = blend_biased(row0[c], row0[c + 3], row1[c], row1[c + 3], fx, fy);
}

// One channel of an inner pixel of an NCHW image: its tap pairs from the word windows of rows iy and
// iy + 1, `words` further on.
__device__ __forceinline__ float blend_plane(const WordWindow& row0, const WordWindow& row1, int words, float fx,
                                             float fy) {
  float b00, b01, b10, b11;
  load_pair_biased(row0, words, b00, b01);
  load_pair_biased(row1, words, b10, b11);
  return blend_biased(b00, b01, b10, b11, fx, fy);
}

// A rim pixel (a tap outside the image, not wholly outside with a constant border): put(c, value)
// stores its 3 values, c in output channel order (handed back through an array for the caller to
// store, they cost the kernel spills); the taps are recomputed from the matrix (keeping the pixel
// loop's coordinates alive for this cost spills). A constant border tests its 4 taps once for the 3 channels instead of
// once per channel behind sample()'s runtime border switch (small outputs have a long rim for their
// area); other modes take the shared sampler.
template <int kColumnStep, typename Put>
__device__ __forceinline__ void rim_pixel(const ForwardParams& p, const double* M, int x, int y, const uint8_t* src,
                                          int row_step, int plane_step, int H, int W, bool constant_border,
                                          const Put& put) {
  const Taps<float> t = taps_from_matrix<float>(M, x, y, kBilinear);
  if (constant_border) {
    const bool in_x0 = static_cast<unsigned>(t.x0) < static_cast<unsigned>(W);
    const bool in_x1 = static_cast<unsigned>(t.x0 + 1) < static_cast<unsigned>(W);
    const bool in_y0 = static_cast<unsigned>(t.y0) < static_cast<unsigned>(H);
    const bool in_y1 = static_cast<unsigned>(t.y0 + 1) < static_cast<unsigned>(H);
    const int o00 = t.y0 * row_step + t.x0 * kColumnStep;
#pragma unroll
    for (int c = 0; c < 3; ++c) {
      const int cs = static_cast<int>(p.transform.source_channel(c, 3));
      const float bval = p.c3_border[c];
      const uint8_t* plane = src + cs * plane_step;
      auto at = [&](bool in, int offset) { return in ? load_acc<float>(plane + (o00 + offset)) : bval; };
      put(c, t.valid ? blend_bilinear(at(in_x0 && in_y0, 0), at(in_x1 && in_y0, kColumnStep), at(in_x0 && in_y1, row_step),
                                      at(in_x1 && in_y1, row_step + kColumnStep), t.fx, t.fy)
                     : bval);
    }
  } else {
#pragma unroll
    for (int c = 0; c < 3; ++c) {
      const int cs = static_cast<int>(p.transform.source_channel(c, 3));
      put(c, sample_plane(t, src + cs * plane_step, kColumnStep, row_step, H, W, p.border, p.c3_border[c]));
    }
  }
}

// Copies one warp's region of the stage (its 2 tile rows from output row row0, `cols` columns from
// tile_x) to image b of the output, as 32-bit words where every run allows it.
template <typename Stage, typename out_t>
__device__ __forceinline__ void copy_region_out(const out_t* region, out_t* out, const ForwardParams& p, int64_t b,
                                                int row0, int tile_x, int lane, bool out_nhwc) {
  const int rows = min(kC3WarpRows, static_cast<int>(p.OH) - row0), cols = min(kC3TileW, static_cast<int>(p.OW) - tile_x);
  out_t* first = out + (out_nhwc ? ((b * p.OH + row0) * p.OW + tile_x) * 3 : (b * 3 * p.OH + row0) * p.OW + tile_x);
  const int64_t row_stride = out_nhwc ? p.OW * 3 : p.OW, plane_stride = p.OH * p.OW;
  // whole words: every run starting on a 4-byte boundary and a whole number of words long
  const bool words = ((reinterpret_cast<uintptr_t>(first) | row_stride * sizeof(out_t) |
                       (out_nhwc ? 0 : plane_stride * sizeof(out_t)) | cols * (out_nhwc ? 3 : 1) * sizeof(out_t)) & 3) == 0;
  if (out_nhwc) {  // runs: the region's rows
    copy_stage<kC3WarpRows, kC3TileW * 3, Stage::kPitchNHWC, Stage::kLanesPerRun>(region, cols * 3, words, lane, [&](int r) -> out_t* {
      return r < rows ? first + r * row_stride : nullptr;
    });
  } else {  // runs: (channel, row) pairs
    copy_stage<3 * kC3WarpRows, kC3TileW, Stage::kPitchNCHW, Stage::kLanesPerRun>(region, cols, words, lane, [&](int i) -> out_t* {
      const int c = i / kC3WarpRows, r = i % kC3WarpRows;
      return r < rows ? first + c * plane_stride + r * row_stride : nullptr;
    });
  }
}

template <bool kNHWC, bool kNormalize, typename out_t>
__global__ void __launch_bounds__(kThreads, kC3BlocksPerSM)
    warp_c3_kernel(const ForwardParams p, out_t* __restrict__ out) {
  using Stage = C3Stage<out_t, kC3TileW>;
  __shared__ __align__(16) out_t stage_all[kThreads / 32 * Stage::kWarpValues];
  constexpr int kColumnStep = kNHWC ? 3 : 1;  // bytes from one input pixel to the next along a row
  const int OH = static_cast<int>(p.OH), OW = static_cast<int>(p.OW);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const bool constant_border = p.border == kConstant, out_nhwc = p.out_channels_last;
  // output channels of sampled channels 0 and 2 (swapped when channels are reversed)
  const int out_ch_of_0 = p.transform.reverse_channels ? 2 : 0, out_ch_of_2 = 2 - out_ch_of_0;
  const int tiles_x = (OW + kC3TileW - 1) / kC3TileW, tiles_y = (OH + kC3TileH - 1) / kC3TileH;
  // The stage holds the block's tile in the output's layout: tile row r in warp r / 2's region, as
  // that region's run r % 2. Channel c of this thread's pixel k in tile row r is at
  // stage_all[stage_row(r) + k * stage_pixel_step + c * stage_channel_step].
  const int stage_pixel_step = out_nhwc ? kC3Lanes * 3 : kC3Lanes;
  const int stage_channel_step = out_nhwc ? 1 : kC3WarpRows * Stage::kPitchNCHW;
  auto stage_row = [&](int r) {
    return (r / kC3WarpRows) * Stage::kWarpValues + (r % kC3WarpRows) * (out_nhwc ? Stage::kPitchNHWC : Stage::kPitchNCHW) +
           lane * (out_nhwc ? 3 : 1);
  };
  out_t* const my_region = stage_all + warp * Stage::kWarpValues;  // the region this warp copies out
  for (int64_t b = blockIdx.z; b < p.B; b += gridDim.z) {
    const ImageDesc im = p.images ? p.images[b] : ImageDesc{p.base + b * p.image_bytes, p.H, p.W};
    const uint8_t* src = im.data;
    const int H = static_cast<int>(im.H), W = static_cast<int>(im.W);
    const int row_step = W * kColumnStep, plane_step = kNHWC ? 1 : H * W, plane_words = plane_step / 4;
    const bool planes_aligned = plane_step % 4 == 0;
    const double* M = p.matrices + b * 6;
    const int shift = c3_lane_shift(M, lane);
    // the tile row of this thread's step j: its warp's rows, sheared by the lane's shift
    auto tile_row = [&](int j) { return (warp * kC3WarpRows + j + shift) & (kC3TileH - 1); };
    for (int ty = blockIdx.y; ty < tiles_y; ty += gridDim.y) {
      const int tile_y = ty * kC3TileH;
      for (int tx = blockIdx.x; tx < tiles_x; tx += gridDim.x) {
        const int tile_x = tx * kC3TileW, x0 = tile_x + lane;
        // pixels x0 + 32k of this thread inside the output
        const int npx = x0 < OW ? min(kC3Px, (OW - x0 + kC3Lanes - 1) / kC3Lanes) : 0;
        // the matrix terms, per tile: kept across the tile loop they took registers from the stage copy
        const double m0 = round_to_float(__ldg(M)), m3 = round_to_float(__ldg(M + 3));
        unsigned rim = 0;  // pixels left for the border-aware second loop: bit j * kC3Px + k
#pragma unroll 1
        for (int j = 0; j < kC3WarpRows; ++j) {
          const int r = tile_row(j), y = tile_y + r;
          if (y >= OH) continue;
          out_t* const st = stage_all + stage_row(r);
          const double rx = round_to_float(row_term(__ldg(M + 1), __ldg(M + 2), y));
          const double ry = round_to_float(row_term(__ldg(M + 4), __ldg(M + 5), y));
          double xd = x0;  // exact; stepping it saves a 64-bit conversion per pixel
#pragma unroll 1
          for (int k = 0; k < npx; ++k, xd += kC3Lanes) {
            const float src_x = source_coord_rounded(m0, rx, xd), src_y = source_coord_rounded(m3, ry, xd);
            const bool valid = coord_ok(src_x) && coord_ok(src_y);
            // floor (make_taps' floor_coord for the coordinates that pass coord_ok; others unused)
            const int ix = __float2int_rd(src_x), iy = __float2int_rd(src_y);
            out_t* const pixel = st + k * stage_pixel_step;
            if (valid && static_cast<unsigned>(ix) < static_cast<unsigned>(W - 1) &&
                static_cast<unsigned>(iy) < static_cast<unsigned>(H - 1)) {
              const float fx = src_x - static_cast<float>(ix), fy = src_y - static_cast<float>(iy);
              const uint8_t* q = src + (iy * row_step + ix * kColumnStep);
              float v[3];
              if constexpr (kNHWC) {
                blend_inner_nhwc(q, row_step, fx, fy, v);
              } else {
                // Written out here, not as a function of its own: wrapped in one (even force-inlined), these
                // loops made the compiler recompute the pixel's coordinates and their floors inside this
                // branch (2 more float-to-int conversions and about 10 more instructions per pixel).
                if (planes_aligned) {  // planes a whole number of words apart: one window per row for the 3 channels
                  const WordWindow w0(q), w1(q + row_step);
#pragma unroll
                  for (int c = 0; c < 3; ++c) v[c] = blend_plane(w0, w1, c * plane_words, fx, fy);
                } else {
#pragma unroll
                  for (int c = 0; c < 3; ++c) {
                    v[c] = blend_plane(WordWindow(q + c * plane_step), WordWindow(q + c * plane_step + row_step), 0, fx, fy);
                  }
                }
              }
              // sampled channel c goes to output channel c, or 2 - c reversed: the reversal picks store
              // offsets (hoisted out of the loop), not values (a select per channel and pixel)
              pixel[out_ch_of_0 * stage_channel_step] = c3_inner_output<out_t, kNormalize>(p.transform, v[0], out_ch_of_0);
              pixel[stage_channel_step] = c3_inner_output<out_t, kNormalize>(p.transform, v[1], 1);
              pixel[out_ch_of_2 * stage_channel_step] = c3_inner_output<out_t, kNormalize>(p.transform, v[2], out_ch_of_2);
            } else if (constant_border && (!valid || static_cast<unsigned>(ix + 1) > static_cast<unsigned>(W) ||
                                           static_cast<unsigned>(iy + 1) > static_cast<unsigned>(H))) {
#pragma unroll
              for (int c = 0; c < 3; ++c) {
                pixel[c * stage_channel_step] = c3_output<out_t, kNormalize>(p.transform, p.c3_border[c], c);
              }
            } else {
              rim |= 1u << (j * kC3Px + k);
            }
          }
        }
        for (int i = 0; rim; ++i, rim >>= 1) {
          if (!(rim & 1u)) continue;
          const int j = i / kC3Px, k = i % kC3Px;
          const int y = tile_y + tile_row(j);
          out_t* const pixel = stage_all + stage_row(tile_row(j)) + k * stage_pixel_step;
          rim_pixel<kColumnStep>(p, M, x0 + kC3Lanes * k, y, src, row_step, plane_step, H, W, constant_border, [&](int c, float v) {
            pixel[c * stage_channel_step] = c3_output<out_t, kNormalize>(p.transform, v, c);
          });
        }
        // a block barrier: the warps wrote each other's regions (and around a __syncwarp that it
        // cannot prove converged, the compiler kept every live value safe, spilling the pixel loop's)
        __syncthreads();
        copy_region_out<Stage>(my_region, out, p, b, tile_y + warp * kC3WarpRows, tile_x, lane, out_nhwc);
        __syncthreads();
      }
    }
  }
}

// Launches the 3-channel kernel over a 3-D grid of (tile column, tile row, image).
template <typename out_t>
void launch_c3(const ForwardParams& p, at::Tensor& out) {
  const int64_t tiles_x = (p.OW + kC3TileW - 1) / kC3TileW, tiles_y = (p.OH + kC3TileH - 1) / kC3TileH;
  // Rows of tiles per block: a block's set-up before its first tile (registers, addresses, about
  // 200 instructions per warp) is paid once for up to 4 tiles, as long as 4 waves of blocks remain
  // to balance the SMs.
  const int64_t resident = int64_t(multiprocessor_count()) * kC3BlocksPerSM;
  const int64_t rows_per_block = std::max<int64_t>(1, std::min<int64_t>(4, tiles_x * tiles_y * p.B / (4 * resident)));
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(tiles_x, int64_t(1) << 30)),
                  static_cast<unsigned>(std::min<int64_t>((tiles_y + rows_per_block - 1) / rows_per_block, 65535)),
                  static_cast<unsigned>(std::min<int64_t>(p.B, 65535)));
  auto kernel = p.transform.normalize ? warp_c3_kernel<false, true, out_t> : warp_c3_kernel<false, false, out_t>;
  if (p.in_channels_last) kernel = p.transform.normalize ? warp_c3_kernel<true, true, out_t> : warp_c3_kernel<true, false, out_t>;
  // the border values the kernel writes, per output channel: the source channel's value saturated
  // to uint8 as cv2 does (Store's host version rounds like the device's), converted once here, not
  // per border pixel
  ForwardParams q = p;
  for (int c = 0; c < 3; ++c) q.c3_border[c] = border_value<float, uint8_t>(p.border_values, p.transform.source_channel(c, 3));
  kernel<<<grid, kThreads, 0, current_stream()>>>(q, out.data_ptr<out_t>());
  ORBBEC_LAUNCH_CHECK();
}

}  // namespace forward_cuda
}  // namespace warpaffine
}  // namespace orbbec
