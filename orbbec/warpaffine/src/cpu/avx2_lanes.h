// Eight-lane pieces shared by the AVX2 row kernels of the CPU warp (warp_row_avx2.h: bilinear,
// warp_nearest_avx2.h, warp_bicubic_avx2.h): source coordinates, border folding, tap reads and
// uint8 stores. Each lane computes one output pixel with the scalar code's operations in the
// scalar code's order (vector float add/mul/sub round like scalar ones; no fma: the CPU warp is
// built with -ffp-contract=off), so results are the same bits. Compiled for AVX2 with a target
// attribute and chosen at run time (warpaffine_cpu.cpp), so the build stays portable.
#pragma once
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "warpaffine/src/cpu/warp_row.h"

namespace orbbec {
namespace warpaffine {
namespace {

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

// The per-row constants of source_coords8 for output row y: float(M[0]), float(row term) and
// float(M[3]), float(row term), held as doubles.
struct RowCoords {
  __m256d m0, row_x, m3, row_y;
};
ORBBEC_AVX2 RowCoords row_coords(const double* M, int64_t y) {
  const double rx = row_term(M[1], M[2], y), ry = row_term(M[4], M[5], y);
  return {_mm256_set1_pd(static_cast<float>(M[0])), _mm256_set1_pd(static_cast<float>(rx)),
          _mm256_set1_pd(static_cast<float>(M[3])), _mm256_set1_pd(static_cast<float>(ry))};
}

// coord_ok for both coordinates of each lane (all ones where |sx| and |sy| < 2^30; NaN fails).
ORBBEC_AVX2 __m256i coords_ok8(__m256 sx, __m256 sy) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 limit = _mm256_set1_ps(static_cast<float>(kMaxCoord));
  return _mm256_castps_si256(_mm256_and_ps(_mm256_cmp_ps(_mm256_and_ps(sx, abs_mask), limit, _CMP_LT_OQ),
                                           _mm256_cmp_ps(_mm256_and_ps(sy, abs_mask), limit, _CMP_LT_OQ)));
}

// All ones in the lanes where 0 <= p < len.
ORBBEC_AVX2 __m256i in_range8(__m256i p, int64_t len) {
  return _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_setzero_si256(), p),
                             _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(len)), p));
}

// border_index for the tap indices p of eight lanes, for taps less than one image length off the
// image: there one fold (or clamp) maps them into [0, len). Lanes still outside after it (farther
// taps, or reflect101 on a one-pixel side) fail in_range8 and are left to the scalar code. The
// constant border keeps p: its outside taps read the border value, which the caller masks in.
ORBBEC_AVX2 __m256i border_fold8(__m256i p, int64_t len, int64_t mode) {
  const __m256i n = _mm256_set1_epi32(static_cast<int>(len));
  const __m256i below = _mm256_cmpgt_epi32(_mm256_setzero_si256(), p);
  const __m256i above = _mm256_cmpgt_epi32(p, _mm256_sub_epi32(n, _mm256_set1_epi32(1)));
  switch (mode) {
    case kReplicate:
      return _mm256_min_epi32(_mm256_max_epi32(p, _mm256_setzero_si256()), _mm256_sub_epi32(n, _mm256_set1_epi32(1)));
    case kWrap:  // p + len below, p - len above
      return _mm256_sub_epi32(_mm256_add_epi32(p, _mm256_and_si256(below, n)), _mm256_and_si256(above, n));
    case kReflect:
    case kReflect101: {  // -p - 1 + delta below, 2 len - 1 - delta - p above
      const int delta = mode == kReflect101 ? 1 : 0;
      const __m256i low = _mm256_sub_epi32(_mm256_set1_epi32(delta - 1), p);
      const __m256i high = _mm256_sub_epi32(_mm256_set1_epi32(static_cast<int>(2 * len - 1 - delta)), p);
      return _mm256_blendv_epi8(_mm256_blendv_epi8(p, low, below), high, above);
    }
    default:
      return p;
  }
}

// 32-bit reads at base + off in the lanes of `lanes`; the other lanes keep `other` and read
// nothing. A read starts at a tap and runs up to 3 bytes past it; each kernel keeps its reads
// inside the image (avx2_layout_ok and a largest offset).
ORBBEC_AVX2 __m256i gather8(const uint8_t* base, __m256i off, __m256i lanes, __m256i other) {
  return _mm256_mask_i32gather_epi32(other, reinterpret_cast<const int*>(base), off, lanes, 1);
}
ORBBEC_AVX2 __m256i gather8(const uint8_t* base, __m256i off, __m256i lanes) {
  return gather8(base, off, lanes, _mm256_setzero_si256());
}

// Byte k of each 32-bit lane, zero-extended to a float.
ORBBEC_AVX2 __m256 byte_as_float(__m256i v, int k) {
  // shuffle_epi8 indexes bytes within each 128-bit half: lane j picks byte 4 j + k, zeros above
  const __m256i first_bytes = _mm256_setr_epi32(int(0x80808000), int(0x80808004), int(0x80808008), int(0x8080800C),
                                                int(0x80808000), int(0x80808004), int(0x80808008), int(0x8080800C));
  const __m256i pick = _mm256_add_epi32(first_bytes, _mm256_set1_epi32(k));
  return _mm256_cvtepi32_ps(_mm256_shuffle_epi8(v, pick));
}
// Byte k of each 32-bit lane, zero-extended.
ORBBEC_AVX2 __m256i byte_of(__m256i v, int k) {
  return _mm256_and_si256(_mm256_srli_epi32(v, 8 * k), _mm256_set1_epi32(0xFF));
}

// Store<uint8_t>::cast: saturate, then round half to even (cvtps rounds as lrintf does, in the
// default rounding mode).
ORBBEC_AVX2 __m256i round_u8(__m256 v) {
  v = _mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), _mm256_set1_ps(255.0f));
  return _mm256_cvtps_epi32(v);
}

// Eight interleaved 3-channel pixels, one per 32-bit lane in its low three bytes, written out as
// 24 bytes.
ORBBEC_AVX2 void store_pixels_packed(uint8_t* o, __m256i pixels) {
  // drop every fourth byte within each 128-bit half, then close the gap between the halves
  const __m256i squeeze = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
                                           0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(pixels, squeeze),
                                                    _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm256_castsi256_si128(bytes));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(o + 16), _mm256_extracti128_si256(bytes, 1));
}
// The three channels of eight pixels, each a value in [0, 255] per 32-bit lane, written out
// interleaved (24 bytes) or one channel to its plane (8 bytes).
ORBBEC_AVX2 void store_packed(uint8_t* o, __m256i c0, __m256i c1, __m256i c2) {
  store_pixels_packed(o, _mm256_or_si256(c0, _mm256_or_si256(_mm256_slli_epi32(c1, 8), _mm256_slli_epi32(c2, 16))));
}
ORBBEC_AVX2 void store_plane(uint8_t* o, __m256i c) {
  const __m256i low_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                             0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(c, low_bytes),
                                                    _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(o), _mm256_castsi256_si128(bytes));
}
// CN channels of eight pixels (values in [0, 255] per lane) to an interleaved 3-channel row or to
// CN planes.
template <int CN, bool PACKED_OUT>
ORBBEC_AVX2 void store_channels(uint8_t* orow, int64_t osc, int64_t x, const __m256i* c) {
  if (PACKED_OUT) {
    store_packed(orow + 3 * x, c[0], c[1], c[2]);
  } else {
    for (int k = 0; k < CN; ++k) store_plane(orow + k * osc + x, c[k]);
  }
}

// Whether an AVX2 kernel can address this CN-channel image and output with 32-bit offsets:
// interleaved 3-channel (sw == 3, sc == 1) or planar (sw == 1) on either side.
bool avx2_layout_ok(const ImageView<uint8_t>& im, const OutView<uint8_t>& out, int64_t CN = 3) {
  const bool in_ok = (CN == 3 && im.sw == 3 && im.sc == 1) || im.sw == 1;
  const bool out_ok = (CN == 3 && out.sw == 3 && out.sc == 1) || out.sw == 1;
  const int64_t extent = im.H * im.sh + im.W * im.sw + 3 * im.sc + 8;
  return in_ok && out_ok && im.H >= 2 && im.W >= 2 && im.H < (1 << 24) && im.W < (1 << 24) && im.sh >= 0 &&
         im.sc >= 0 && extent < (int64_t(1) << 31);
}

// The largest tap offset whose 4-byte read stays inside the image: the last byte of the image is
// that of its last pixel (its third channel when interleaved).
inline int last_read_offset(const ImageView<uint8_t>& im, bool packed_in) {
  return static_cast<int>((im.H - 1) * im.sh + (im.W - 1) * im.sw + (packed_in ? 2 : 0)) - 3;
}

// The border values as 32-bit lanes that a read would give: one word holding the three channels
// of an interleaved image, or one word per plane.
template <int CN, bool PACKED_IN>
ORBBEC_AVX2 void border_words(const float* bval, __m256i* words) {
  int v[CN];
  for (int k = 0; k < CN; ++k) v[k] = Store<uint8_t, float>::cast(bval[k]);
  if (PACKED_IN) {
    words[0] = _mm256_set1_epi32(v[0] | v[1] << 8 | v[2] << 16);
  } else {
    for (int k = 0; k < CN; ++k) words[k] = _mm256_set1_epi32(v[k]);
  }
}

// One output row as warp_images hands it to a row kernel.
struct RowJob {
  const ImageView<uint8_t>& im;
  const double* M;
  int64_t y;
  uint8_t* orow;
  const OutView<uint8_t>& out;
  int64_t OW, interp, border;
  const float* bval;
  const OutputTransform& ot;
};

// The scalar row code on output pixels [begin, end) of the row.
template <int CN>
void scalar_span(const RowJob& r, int64_t begin, int64_t end) {
  warp_span<uint8_t, uint8_t, CN, true>(r.im, r.M, r.y, r.orow, r.out, CN, begin, end, r.interp, r.border, r.bval,
                                        r.ot);
}
// The scalar row code on the pixels x + k of the set bits k of `lanes` (an 8-bit mask).
template <int CN>
void scalar_lanes(int lanes, const RowJob& r, int64_t x) {
  for (; lanes != 0; lanes &= lanes - 1) {
    const int64_t xi = x + __builtin_ctz(lanes);
    scalar_span<CN>(r, xi, xi + 1);
  }
}

ORBBEC_AVX2 int lane_bits(__m256i mask) { return _mm256_movemask_ps(_mm256_castsi256_ps(mask)); }

// warp_row's signature, for warp_images: Kernel::run<CN, PACKED_IN, PACKED_OUT> for this layout (interleaved or planar input
// and output), or the scalar row where the kernel cannot address the image.
template <typename Kernel, int CN>
void avx2_row(const ImageView<uint8_t>& im, const double* M, int64_t y, uint8_t* orow, const OutView<uint8_t>& out,
              int64_t C, int64_t OW, int64_t interp, int64_t border, const float* bval, const OutputTransform& ot) {
  if (!avx2_layout_ok(im, out, CN)) {
    warp_row<uint8_t, uint8_t, CN, true>(im, M, y, orow, out, C, OW, interp, border, bval, ot);
    return;
  }
  const RowJob job{im, M, y, orow, out, OW, interp, border, bval, ot};
  if constexpr (CN == 3) {
    if (im.sw == 3) return out.sw == 3 ? Kernel::template run<3, true, true>(job) : Kernel::template run<3, true, false>(job);
    if (out.sw == 3) return Kernel::template run<3, false, true>(job);
  }
  Kernel::template run<CN, false, false>(job);
}
}  // namespace
}  // namespace warpaffine
}  // namespace orbbec
#endif  // x86_64 with GCC or Clang
