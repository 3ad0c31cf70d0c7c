// The AVX2 row kernel of the CPU warp (uint8 -> uint8, bilinear, 3 channels), chosen at run time by
// warpaffine_cpu.cpp where the CPU has AVX2. Included by warpaffine_cpu.cpp only (one translation unit).
#pragma once
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "warpaffine/src/cpu/warp_row.h"

namespace orbbec {
namespace warpaffine {
namespace {

// AVX2 row kernel of the most common warp: uint8 -> uint8, bilinear, 3 channels, interleaved (HWC)
// or planar (CHW) images. Eight output pixels per step, with the scalar code's arithmetic in the
// scalar code's order, lane by lane, so results are the same bits (vector float add/mul/sub round
// like scalar ones; no fma: warpaffine_cpu.cpp is built with -ffp-contract=off). Any step of eight with a
// pixel whose four taps are not all inside the image goes to warp_span, which handles borders.
// Compiled for AVX2 with a target attribute and chosen at run time, so the build stays portable.
#define ORBBEC_AVX2 __attribute__((target("avx2"), always_inline)) inline

// Source coordinates of output pixels x .. x + 7: float(double(float(m0)) * x + double(float(row_term)))
// as source_coord computes it. The product is exact in double, so the vector result is identical.
ORBBEC_AVX2 __m256 source_coords8(__m256d m0, __m256d row, int64_t x) {
  const __m256d x_lo = _mm256_add_pd(_mm256_set1_pd(static_cast<double>(x)), _mm256_setr_pd(0, 1, 2, 3));
  const __m256d x_hi = _mm256_add_pd(x_lo, _mm256_set1_pd(4));
  const __m128 lo = _mm256_cvtpd_ps(_mm256_add_pd(_mm256_mul_pd(m0, x_lo), row));
  const __m128 hi = _mm256_cvtpd_ps(_mm256_add_pd(_mm256_mul_pd(m0, x_hi), row));
  return _mm256_set_m128(hi, lo);
}

// Byte k of each 32-bit lane, zero-extended to a float.
ORBBEC_AVX2 __m256 byte_as_float(__m256i v, int k) {
  // shuffle_epi8 indexes bytes within each 128-bit half: lane j picks byte 4 j + k, zeros above
  const __m256i first_bytes = _mm256_setr_epi32(int(0x80808000), int(0x80808004), int(0x80808008), int(0x8080800C),
                                                int(0x80808000), int(0x80808004), int(0x80808008), int(0x8080800C));
  const __m256i pick = _mm256_add_epi32(first_bytes, _mm256_set1_epi32(k));
  return _mm256_cvtepi32_ps(_mm256_shuffle_epi8(v, pick));
}

// blend_bilinear, eight pixels at once: along x first, then y.
ORBBEC_AVX2 __m256 blend8(__m256 p00, __m256 p01, __m256 p10, __m256 p11, __m256 fx, __m256 fy) {
  const __m256 v0 = _mm256_add_ps(p00, _mm256_mul_ps(fx, _mm256_sub_ps(p01, p00)));
  const __m256 v1 = _mm256_add_ps(p10, _mm256_mul_ps(fx, _mm256_sub_ps(p11, p10)));
  return _mm256_add_ps(v0, _mm256_mul_ps(fy, _mm256_sub_ps(v1, v0)));
}

// Store<uint8_t>::cast: saturate, then round half to even (cvtps rounds as lrintf does, in the
// default rounding mode). A blend of bytes stays within [0, 255]; the clamp only mirrors Store.
ORBBEC_AVX2 __m256i round_u8(__m256 v) {
  v = _mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), _mm256_set1_ps(255.0f));
  return _mm256_cvtps_epi32(v);
}

// The three channels of eight pixels, each a value in [0, 255] per 32-bit lane, written out
// interleaved (24 bytes) or to three planes (8 bytes each).
ORBBEC_AVX2 void store_packed(uint8_t* o, __m256i c0, __m256i c1, __m256i c2) {
  const __m256i bgr0 = _mm256_or_si256(c0, _mm256_or_si256(_mm256_slli_epi32(c1, 8), _mm256_slli_epi32(c2, 16)));
  // drop every fourth byte within each 128-bit half, then close the gap between the halves
  const __m256i squeeze = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
                                           0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(bgr0, squeeze),
                                                    _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm256_castsi256_si128(bytes));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(o + 16), _mm256_extracti128_si256(bytes, 1));
}
ORBBEC_AVX2 void store_plane(uint8_t* o, __m256i c) {
  const __m256i low_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                             0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(c, low_bytes),
                                                    _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(o), _mm256_castsi256_si128(bytes));
}

// 32-bit reads at base + off in the lanes of `lanes` (others read nothing and hold 0). A read
// starts at a tap and runs up to 3 bytes past it; avx2_layout_ok and the max_off test of the row
// kernel keep every read inside the image.
ORBBEC_AVX2 __m256i gather8(const uint8_t* base, __m256i off, __m256i lanes) {
  return _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), reinterpret_cast<const int*>(base), off, lanes, 1);
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

// Whether the fast kernel can address this image and output with 32-bit offsets.
bool avx2_layout_ok(const ImageView<uint8_t>& im, const OutView<uint8_t>& out) {
  const bool in_ok = (im.sw == 3 && im.sc == 1) || im.sw == 1;
  const bool out_ok = (out.sw == 3 && out.sc == 1) || out.sw == 1;
  const int64_t extent = im.H * im.sh + im.W * im.sw + 3 * im.sc + 8;
  return in_ok && out_ok && im.H >= 2 && im.W >= 2 && im.H < (1 << 24) && im.W < (1 << 24) && im.sh >= 0 &&
         im.sc >= 0 && extent < (int64_t(1) << 31);
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
  const double rx = row_term(M[1], M[2], y), ry = row_term(M[4], M[5], y);
  const __m256d m0 = _mm256_set1_pd(static_cast<float>(M[0])), m3 = _mm256_set1_pd(static_cast<float>(M[3]));
  const __m256d row_x = _mm256_set1_pd(static_cast<float>(rx)), row_y = _mm256_set1_pd(static_cast<float>(ry));
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
    const __m256 sx = source_coords8(m0, row_x, x), sy = source_coords8(m3, row_y, x);
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
    if (PACKED_OUT) {
      store_packed(orow + 3 * x, c[0], c[1], c[2]);
    } else {
      for (int k = 0; k < 3; ++k) store_plane(orow + k * out.sc + x, c[k]);
    }
    for (int rest = ~(fast_bits | fill_bits) & 0xFF; rest != 0; rest &= rest - 1) {
      const int64_t xi = x + __builtin_ctz(rest);
      warp_span<uint8_t, uint8_t, 3, true>(im, M, y, orow, out, 3, xi, xi + 1, interp, border, bval, ot);
    }
  }
  warp_span<uint8_t, uint8_t, 3, true>(im, M, y, orow, out, 3, x, OW, interp, border, bval, ot);
}

// warp_row's signature, for warp_images: picks the layout's kernel, or the scalar row.
void warp_row_u8_fast(const ImageView<uint8_t>& im, const double* M, int64_t y, uint8_t* orow,
                      const OutView<uint8_t>& out, int64_t C, int64_t OW, int64_t interp, int64_t border,
                      const float* bval, const OutputTransform& ot) {
  if (!avx2_layout_ok(im, out)) {
    warp_row<uint8_t, uint8_t, 3, true>(im, M, y, orow, out, C, OW, interp, border, bval, ot);
    return;
  }
  const bool packed_in = im.sw == 3, packed_out = out.sw == 3;
  auto kernel = packed_in ? (packed_out ? &warp_row_u8_avx2<true, true> : &warp_row_u8_avx2<true, false>)
                          : (packed_out ? &warp_row_u8_avx2<false, true> : &warp_row_u8_avx2<false, false>);
  kernel(im, M, y, orow, out, OW, interp, border, bval, ot);
}

}  // namespace
}  // namespace warpaffine
}  // namespace orbbec
#endif  // x86_64 with GCC or Clang
