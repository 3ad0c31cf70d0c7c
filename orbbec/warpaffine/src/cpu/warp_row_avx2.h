// The AVX2 row kernel of the CPU warp for uint8 -> uint8 bilinear, 3 channels, chosen at run time
// by warpaffine_cpu.cpp where the CPU has AVX2. Included by warpaffine_cpu.cpp only (one
// translation unit).
#pragma once
#if defined(__x86_64__) && defined(__GNUC__)
#include "warpaffine/src/cpu/avx2_lanes.h"

namespace orbbec {
namespace warpaffine {
namespace {

// Interleaved (HWC) or planar (CHW) images, eight output pixels per step (avx2_lanes.h says how the
// bits stay the scalar code's). Any step of eight with a pixel whose four taps are not all inside
// the image goes to warp_span, which handles borders.

// blend_bilinear, eight pixels at once: along x first, then y.
ORBBEC_AVX2 __m256 blend8(__m256 p00, __m256 p01, __m256 p10, __m256 p11, __m256 fx, __m256 fy) {
  const __m256 v0 = _mm256_add_ps(p00, _mm256_mul_ps(fx, _mm256_sub_ps(p01, p00)));
  const __m256 v1 = _mm256_add_ps(p10, _mm256_mul_ps(fx, _mm256_sub_ps(p11, p10)));
  return _mm256_add_ps(v0, _mm256_mul_ps(fy, _mm256_sub_ps(v1, v0)));
}

// Interleaved image (sw == 3, sc == 1): one read at a tap holds its three channels.
ORBBEC_AVX2 void blend_packed(const uint8_t* base, int64_t sh, __m256i off, __m256i lanes, __m256 fx, __m256 fy,
                              __m256i c[3]) {
  const __m256i t00 = gather8(base, off, lanes), t01 = gather8(base + 3, off, lanes);
  const __m256i t10 = gather8(base + sh, off, lanes), t11 = gather8(base + sh + 3, off, lanes);
  for (int k = 0; k < 3; ++k) {
    c[k] = round_u8(blend8(byte_as_float(t00, k), byte_as_float(t01, k), byte_as_float(t10, k),
                           byte_as_float(t11, k), fx, fy));
  }
}
// Planar image (sw == 1): one read at a tap holds it and its right neighbour.
ORBBEC_AVX2 void blend_planar(const uint8_t* base, int64_t sh, int64_t sc, __m256i off, __m256i lanes, __m256 fx,
                              __m256 fy, __m256i c[3]) {
  for (int k = 0; k < 3; ++k) {
    const __m256i t0 = gather8(base + k * sc, off, lanes), t1 = gather8(base + k * sc + sh, off, lanes);
    c[k] = round_u8(blend8(byte_as_float(t0, 0), byte_as_float(t0, 1), byte_as_float(t1, 0), byte_as_float(t1, 1),
                           fx, fy));
  }
}

// Eight output pixels fall into three kinds: `inside` ones, whose four taps are in the image
// (blended here); with a constant border, `outside` ones, whose taps are all off the image or whose
// coordinates are not finite or too far (they get the border value, as sample() would give them);
// and the rest, near an edge or with another border mode, which warp_span computes one by one
// after the vector store.
template <bool PACKED_IN, bool PACKED_OUT>
__attribute__((target("avx2"))) void warp_row_u8_avx2(const ImageView<uint8_t>& im, const double* M, int64_t y,
                                                      uint8_t* orow, const OutView<uint8_t>& out, int64_t OW,
                                                      int64_t interp, int64_t border, const float* bval,
                                                      const OutputTransform& ot) {
  const RowCoords rc = row_coords(M, y);
  // floor(x) in [0, W - 2]: all taps inside; in [-1, W - 1]: some tap may be inside
  const __m256 zero = _mm256_setzero_ps(), minus_one = _mm256_set1_ps(-1.0f);
  const __m256 w2 = _mm256_set1_ps(static_cast<float>(im.W - 2)), h2 = _mm256_set1_ps(static_cast<float>(im.H - 2));
  const __m256 w1 = _mm256_set1_ps(static_cast<float>(im.W - 1)), h1 = _mm256_set1_ps(static_cast<float>(im.H - 1));
  const int sw = PACKED_IN ? 3 : 1, sh = static_cast<int>(im.sh);
  // Largest tap offset whose 4-byte reads stay inside the image: the last read starts at
  // off + sh (+ 3 for the right tap of an interleaved image) and ends 3 bytes further.
  const int last_byte = static_cast<int>((im.H - 1) * im.sh + (im.W - 1) * sw + (PACKED_IN ? 2 : 0));
  const __m256i max_off = _mm256_set1_epi32(last_byte - sh - (PACKED_IN ? 3 : 0) - 3);
  const bool fill_outside = border == kConstant;
  __m256i fill[3];
  for (int k = 0; k < 3; ++k) fill[k] = _mm256_set1_epi32(Store<uint8_t, float>::cast(bval[k]));

  int64_t x = 0;
  for (; x + 8 <= OW; x += 8) {
    const __m256 sx = source_coords8(rc.m0, rc.row_x, x), sy = source_coords8(rc.m3, rc.row_y, x);
    const __m256 fl_x = _mm256_floor_ps(sx), fl_y = _mm256_floor_ps(sy);  // NaN stays NaN: no compare holds
    const __m256 inside = _mm256_and_ps(
        _mm256_and_ps(_mm256_cmp_ps(fl_x, zero, _CMP_GE_OQ), _mm256_cmp_ps(fl_x, w2, _CMP_LE_OQ)),
        _mm256_and_ps(_mm256_cmp_ps(fl_y, zero, _CMP_GE_OQ), _mm256_cmp_ps(fl_y, h2, _CMP_LE_OQ)));
    const __m256 near = _mm256_and_ps(
        _mm256_and_ps(_mm256_cmp_ps(fl_x, minus_one, _CMP_GE_OQ), _mm256_cmp_ps(fl_x, w1, _CMP_LE_OQ)),
        _mm256_and_ps(_mm256_cmp_ps(fl_y, minus_one, _CMP_GE_OQ), _mm256_cmp_ps(fl_y, h1, _CMP_LE_OQ)));
    const __m256i off = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_cvttps_epi32(fl_y), _mm256_set1_epi32(sh)),
                                         _mm256_mullo_epi32(_mm256_cvttps_epi32(fl_x), _mm256_set1_epi32(sw)));
    const __m256i fast = _mm256_andnot_si256(_mm256_cmpgt_epi32(off, max_off), _mm256_castps_si256(inside));
    const int fast_bits = _mm256_movemask_ps(_mm256_castsi256_ps(fast));
    const int fill_bits = fill_outside ? ~_mm256_movemask_ps(near) & 0xFF : 0;
    if ((fast_bits | fill_bits) == 0) {  // all eight near an edge: nothing to gain here
      warp_span<uint8_t, uint8_t, 3, true>(im, M, y, orow, out, 3, x, x + 8, interp, border, bval, ot);
      continue;
    }
    __m256i c[3] = {fill[0], fill[1], fill[2]};
    if (fast_bits != 0) {
      // exact, as in make_taps: sx and floor(sx) are within one binade
      const __m256 fx = _mm256_sub_ps(sx, fl_x), fy = _mm256_sub_ps(sy, fl_y);
      __m256i v[3];
      if (PACKED_IN) {
        blend_packed(im.data, im.sh, off, fast, fx, fy, v);
      } else {
        blend_planar(im.data, im.sh, im.sc, off, fast, fx, fy, v);
      }
      for (int k = 0; k < 3; ++k) c[k] = _mm256_blendv_epi8(c[k], v[k], fast);
    }
    store_channels<3, PACKED_OUT>(orow, out.sc, x, c);
    for (int rest = ~(fast_bits | fill_bits) & 0xFF; rest != 0; rest &= rest - 1) {
      const int64_t xi = x + __builtin_ctz(rest);
      warp_span<uint8_t, uint8_t, 3, true>(im, M, y, orow, out, 3, xi, xi + 1, interp, border, bval, ot);
    }
  }
  warp_span<uint8_t, uint8_t, 3, true>(im, M, y, orow, out, 3, x, OW, interp, border, bval, ot);
}

struct BilinearAvx2 {
  template <int CN, bool PACKED_IN, bool PACKED_OUT>
  static void run(const RowJob& r) {
    static_assert(CN == 3, "the bilinear kernel is for 3 channels");
    warp_row_u8_avx2<PACKED_IN, PACKED_OUT>(r.im, r.M, r.y, r.orow, r.out, r.OW, r.interp, r.border, r.bval, r.ot);
  }
};

}  // namespace
}  // namespace warpaffine
}  // namespace orbbec
#endif  // x86_64 with GCC or Clang
