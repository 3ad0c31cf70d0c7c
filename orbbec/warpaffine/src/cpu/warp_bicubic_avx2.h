// The AVX2 row kernel of the CPU warp for uint8 -> uint8 bicubic, 1 or 3 channels, every border
// mode, chosen at run time by warpaffine_cpu.cpp. Included by warpaffine_cpu.cpp only.
#pragma once
#if defined(__x86_64__) && defined(__GNUC__)
#include <climits>

#include "warpaffine/src/cpu/avx2_lanes.h"

namespace orbbec {
namespace warpaffine {
namespace {

// cubic_weights for eight lanes: the same operations in the same order (1 - t for add_rn(1, -t)
// and w - v for add_rn(w, -v) are the same IEEE operation).
ORBBEC_AVX2 void cubic_weights8(__m256 t, __m256 w[4]) {
  const __m256 one = _mm256_set1_ps(1.0f), a = _mm256_set1_ps(1.25f), b = _mm256_set1_ps(-2.25f);
  const __m256 u = _mm256_add_ps(t, one), s = _mm256_sub_ps(one, t);
  const __m256 w0 = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(-0.75f), u), _mm256_set1_ps(3.75f));
  w[0] = _mm256_add_ps(_mm256_mul_ps(_mm256_add_ps(_mm256_mul_ps(w0, u), _mm256_set1_ps(-6.0f)), u),
                       _mm256_set1_ps(3.0f));
  w[1] = _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_add_ps(_mm256_mul_ps(a, t), b), t), t), one);
  w[2] = _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_add_ps(_mm256_mul_ps(a, s), b), s), s), one);
  w[3] = _mm256_sub_ps(_mm256_sub_ps(_mm256_sub_ps(one, w[0]), w[1]), w[2]);
}

// The four tap columns (or rows) p .. p + 3 of eight pixels through the border rule: their byte
// offsets (index times stride), which are inside the image, and the largest index of a tap inside
// (for the test that no read runs past the image's end).
struct TapLines {
  __m256i off[4], in[4], all_in, any_in, last;
};
ORBBEC_AVX2 TapLines tap_lines(__m256i p, int64_t len, int64_t mode, __m256i stride) {
  TapLines t;
  t.all_in = _mm256_set1_epi32(-1);
  t.any_in = _mm256_setzero_si256();
  __m256i top = _mm256_set1_epi32(INT_MIN);
  for (int k = 0; k < 4; ++k) {
    const __m256i index = border_fold8(_mm256_add_epi32(p, _mm256_set1_epi32(k)), len, mode);
    t.in[k] = in_range8(index, len);
    t.off[k] = _mm256_mullo_epi32(index, stride);
    t.all_in = _mm256_and_si256(t.all_in, t.in[k]);
    t.any_in = _mm256_or_si256(t.any_in, t.in[k]);
    top = _mm256_max_epi32(top, index);
  }
  t.last = _mm256_min_epi32(top, _mm256_set1_epi32(static_cast<int>(len - 1)));
  return t;
}

// Eight output pixels per step: floor and fraction of the source coordinates as make_taps, the
// weights as cubic_weights, the 4 x 4 taps folded into the image by the border rule, each read as
// 32 bits (three channels when interleaved, one plane's byte when planar; a constant border's
// outside taps read the border value), and the sum in sample()'s order. The scalar code starts
// each sum at 0; starting at the first product gives the same value but the sign of a zero, which
// the uint8 store ignores. Lanes whose coordinates are not finite or too far get the border value;
// lanes that one fold does not bring inside (another mode's taps more than an image length off)
// or whose reads would run past the image's end go to the scalar code after the vector store.
struct BicubicAvx2 {
  template <int CN, bool PACKED_IN, bool PACKED_OUT>
  __attribute__((target("avx2"))) static void run(const RowJob& r) {
    const ImageView<uint8_t>& im = r.im;
    constexpr int kWords = PACKED_IN ? 1 : CN;  // 32-bit reads per tap
    const RowCoords rc = row_coords(r.M, r.y);
    const bool constant = r.border == kConstant;
    const __m256i sh = _mm256_set1_epi32(static_cast<int>(im.sh)), sw = _mm256_set1_epi32(PACKED_IN ? 3 : 1);
    const __m256i max_off = _mm256_set1_epi32(last_read_offset(im, PACKED_IN));
    __m256i fill_words[kWords], fill[CN];
    border_words<CN, PACKED_IN>(r.bval, fill_words);
    for (int k = 0; k < CN; ++k) fill[k] = byte_of(fill_words[PACKED_IN ? 0 : k], PACKED_IN ? k : 0);

    int64_t x = 0;
    for (; x + 8 <= r.OW; x += 8) {
      const __m256 sx = source_coords8(rc.m0, rc.row_x, x), sy = source_coords8(rc.m3, rc.row_y, x);
      const __m256i valid = coords_ok8(sx, sy);
      const __m256 fl_x = _mm256_floor_ps(sx), fl_y = _mm256_floor_ps(sy);
      const __m256i one = _mm256_set1_epi32(1);  // the first tap is one left of and above floor(s)
      const TapLines cols = tap_lines(_mm256_sub_epi32(_mm256_cvttps_epi32(fl_x), one), im.W, r.border, sw);
      const TapLines rows = tap_lines(_mm256_sub_epi32(_mm256_cvttps_epi32(fl_y), one), im.H, r.border, sh);
      const __m256i any_in = _mm256_and_si256(cols.any_in, rows.any_in);
      const __m256i last = _mm256_add_epi32(_mm256_mullo_epi32(rows.last, sh), _mm256_mullo_epi32(cols.last, sw));
      const __m256i safe = _mm256_andnot_si256(_mm256_and_si256(_mm256_cmpgt_epi32(last, max_off), any_in),
                                               _mm256_set1_epi32(-1));
      const __m256i folded = constant ? valid : _mm256_and_si256(valid, _mm256_and_si256(cols.all_in, rows.all_in));
      const __m256i vec = _mm256_and_si256(folded, safe);
      const int vec_bits = lane_bits(vec);
      __m256i c[CN];
      for (int k = 0; k < CN; ++k) c[k] = fill[k];
      // Lanes with every tap on the constant border come out as the border value: the weights sum
      // to 1 within a few float roundings, so the sum rounds back to the byte. Whole steps of them
      // (the corners of a rotated output) skip the sums.
      if ((vec_bits & lane_bits(any_in)) != 0) {
        const __m256 fx = _mm256_sub_ps(sx, fl_x), fy = _mm256_sub_ps(sy, fl_y);  // exact, as make_taps
        __m256 wx[4], wy[4], sum[CN];
        cubic_weights8(fx, wx);
        cubic_weights8(fy, wy);
        for (int j = 0; j < 4; ++j) {
          __m256 row_sum[CN];
          for (int i = 0; i < 4; ++i) {
            const __m256i off = _mm256_add_epi32(rows.off[j], cols.off[i]);
            const __m256i lanes = constant ? _mm256_and_si256(vec, _mm256_and_si256(rows.in[j], cols.in[i])) : vec;
            __m256i words[kWords];
            for (int g = 0; g < kWords; ++g) words[g] = gather8(im.data + g * im.sc, off, lanes, fill_words[g]);
            for (int k = 0; k < CN; ++k) {
              const __m256 term = _mm256_mul_ps(wx[i], byte_as_float(words[PACKED_IN ? 0 : k], PACKED_IN ? k : 0));
              row_sum[k] = i == 0 ? term : _mm256_add_ps(row_sum[k], term);
            }
          }
          for (int k = 0; k < CN; ++k) {
            const __m256 term = _mm256_mul_ps(wy[j], row_sum[k]);
            sum[k] = j == 0 ? term : _mm256_add_ps(sum[k], term);
          }
        }
        for (int k = 0; k < CN; ++k) c[k] = _mm256_blendv_epi8(fill[k], round_u8(sum[k]), vec);
      }
      store_channels<CN, PACKED_OUT>(r.orow, r.out.sc, x, c);
      scalar_lanes<CN>(lane_bits(valid) & ~vec_bits, r, x);
    }
    scalar_span<CN>(r, x, r.OW);
  }
};

}  // namespace
}  // namespace warpaffine
}  // namespace orbbec
#endif  // x86_64 with GCC or Clang
