// CPU kernels of warp_affine: one output row per task of at::parallel_for, the per-pixel math in
// common/warpaffine.h (the same code the CUDA kernels run, hence the same bits).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "warpaffine/src/warpaffine_ext.h"

namespace orbbec {
namespace warpaffine {
namespace {

template <typename scalar_t>
using acc_type = typename std::conditional<std::is_same<scalar_t, double>::value, double, float>::type;

// One image as the kernels read it: element (c, y, x) at data[c * sc + y * sh + x * sw].
template <typename T>
struct ImageView {
  const T* data;
  int64_t H, W, sc, sh, sw;
};
// Where output element (b, c, y, x) goes.
template <typename T>
struct OutView {
  T* data;
  int64_t sb, sc, sh, sw;
};

template <typename T>
std::vector<ImageView<T>> batch_views(const at::Tensor& src) {
  std::vector<ImageView<T>> views(src.size(0));
  for (int64_t b = 0; b < src.size(0); ++b) {
    views[b] = {src.data_ptr<T>() + b * src.stride(0), src.size(2), src.size(3), src.stride(1), src.stride(2),
                src.stride(3)};
  }
  return views;
}

template <typename T>
OutView<T> out_view(at::Tensor& out) {
  return {out.data_ptr<T>(), out.stride(0), out.stride(1), out.stride(2), out.stride(3)};
}

// Output pixels [x_begin, x_end) of row y. CN > 0 fixes the channel count at compile time and
// PLAIN says the output transform is off, so the common uint8 3-channel warp runs without
// per-value branches.
template <typename in_t, typename out_t, int CN, bool PLAIN>
void warp_span(const ImageView<in_t>& im, const double* M, int64_t y, out_t* orow, const OutView<out_t>& out,
               int64_t C_dynamic, int64_t x_begin, int64_t x_end, int64_t interp, int64_t border,
               const acc_type<in_t>* bval, const OutputTransform& ot) {
  using acc_t = acc_type<in_t>;
  const int64_t C = CN > 0 ? CN : C_dynamic;
  const double rx = row_term(M[1], M[2], y), ry = row_term(M[4], M[5], y);
  const int64_t sw = im.sw, sh = im.sh, sc = im.sc, osc = out.sc, osw = out.sw;
  for (int64_t x = x_begin; x < x_end; ++x) {
    const Taps<acc_t> t = make_taps(source_coord(M[0], rx, x, acc_t()), source_coord(M[3], ry, x, acc_t()), interp);
    if (t.valid && t.n == 2 && t.x0 >= 0 && t.x0 < im.W - 1 && t.y0 >= 0 && t.y0 < im.H - 1) {
      // Bilinear with all four taps inside: the common case, without per-tap border tests.
      const in_t* p = im.data + t.y0 * sh + t.x0 * sw;
      out_t* o = orow + x * osw;
      for (int64_t c = 0; c < C; ++c) {
        const in_t* q = p + (PLAIN ? c : ot.source_channel(c, C)) * sc;
        const acc_t v = blend_bilinear<acc_t>(q[0], q[sw], q[sh], q[sh + sw], t.fx, t.fy);
        o[c * osc] = Store<out_t, acc_t>::cast(PLAIN ? v : ot.apply(v, c));
      }
      continue;
    }
    for (int64_t c = 0; c < C; ++c) {
      const int64_t cs = ot.source_channel(c, C);
      const in_t* plane = im.data + cs * sc;
      auto fetch = [&](int64_t ix, int64_t iy) { return static_cast<acc_t>(plane[iy * sh + ix * sw]); };
      const acc_t v = sample(t, im.H, im.W, border, bval[cs], fetch);
      orow[c * osc + x * osw] = Store<out_t, acc_t>::cast(ot.apply(v, c));
    }
  }
}

// One whole output row (the signature warp_images calls through).
template <typename in_t, typename out_t, int CN, bool PLAIN>
void warp_row(const ImageView<in_t>& im, const double* M, int64_t y, out_t* orow, const OutView<out_t>& out,
              int64_t C, int64_t OW, int64_t interp, int64_t border, const acc_type<in_t>* bval,
              const OutputTransform& ot) {
  warp_span<in_t, out_t, CN, PLAIN>(im, M, y, orow, out, C, 0, OW, interp, border, bval, ot);
}

#if defined(__x86_64__) && defined(__GNUC__)
// AVX2 row kernel of the most common warp: uint8 -> uint8, bilinear, 3 channels, interleaved (HWC)
// or planar (CHW) images. Eight output pixels per step, with the scalar code's arithmetic in the
// scalar code's order, lane by lane, so results are the same bits (vector float add/mul/sub round
// like scalar ones; no fma: the file is built with -ffp-contract=off). Any step of eight with a
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
#endif

// A faster row kernel for this warp on this CPU, or nullptr.
template <typename in_t, typename out_t>
auto fast_row(int64_t C, int64_t interp, bool plain) -> decltype(&warp_row<in_t, out_t, 3, true>) {
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (std::is_same<in_t, uint8_t>::value && std::is_same<out_t, uint8_t>::value) {
    static const bool has_avx2 = __builtin_cpu_supports("avx2");
    if (has_avx2 && C == 3 && interp == kBilinear && plain) return &warp_row_u8_fast;
  }
#endif
  return nullptr;
}

// Pulls slice `slice` of `slices` of an image's bytes towards the core (into L2). A batch of
// images does not fit in the caches, and a rotated warp walks each image across its rows in an
// order the hardware prefetchers do not follow, so without this the kernels mostly wait for
// memory. Skipped for images too big to stay in L2 alongside the one being warped, and for sparse
// views, whose footprint is mostly bytes the warp never reads. Always inlined: GCC deems a call
// to a function that only prefetches free of effects and deletes it.
template <typename T>
inline __attribute__((always_inline)) void prefetch_image_slice(const ImageView<T>& im, int64_t C, int64_t slice,
                                                                int64_t slices) {
  constexpr int64_t kMaxBytes = 512 * 1024, kLine = 64;
  const int64_t bytes = ((C - 1) * im.sc + (im.H - 1) * im.sh + (im.W - 1) * im.sw + 1) * int64_t(sizeof(T));
  if (bytes > kMaxBytes || bytes > 2 * C * im.H * im.W * int64_t(sizeof(T))) return;
  const char* p = reinterpret_cast<const char*>(im.data);
  const int64_t per_slice = (bytes + slices - 1) / slices;
  const int64_t end = std::min(bytes, (slice + 1) * per_slice);
  for (int64_t o = slice * per_slice; o < end; o += kLine) __builtin_prefetch(p + o, 0, 2);
}

// Warps every image into out: one output row per task. The plain op is the case out_t == in_t
// with the output transform off.
template <typename in_t, typename out_t>
void warp_images(const std::vector<ImageView<in_t>>& images, const double* mats, OutView<out_t> out, int64_t C,
                 int64_t OH, int64_t OW, int64_t interp, int64_t border, const BorderValues& bv,
                 const OutputTransform& ot) {
  using acc_t = acc_type<in_t>;
  // The border value as the image type holds it (cv2 saturates it to the type first).
  std::vector<acc_t> bval(C);
  for (int64_t c = 0; c < C; ++c) bval[c] = static_cast<acc_t>(Store<in_t, double>::cast(bv[c]));
  const int64_t B = static_cast<int64_t>(images.size());
  const bool plain = !ot.normalize && !ot.reverse_channels;
  auto row = C == 3 ? (plain ? &warp_row<in_t, out_t, 3, true> : &warp_row<in_t, out_t, 3, false>)
                    : (plain ? &warp_row<in_t, out_t, 0, true> : &warp_row<in_t, out_t, 0, false>);
  if (auto fast = fast_row<in_t, out_t>(C, interp, plain)) row = fast;

  at::parallel_for(0, B * OH, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / OH, y = r % OH;
      // While warping image b, fetch image b + 2 if this task warps it too (one image ahead
      // measured slower: its bytes were often not in yet). The task's first two images are
      // fetched whole as it starts.
      constexpr int64_t kAhead = 2;
      if (r == begin) {
        for (int64_t i = b; i < std::min(b + kAhead, B); ++i) prefetch_image_slice(images[i], C, 0, 1);
      }
      if ((b + kAhead) * OH < end) prefetch_image_slice(images[b + kAhead], C, y, OH);
      row(images[b], mats + b * 6, y, out.data + b * out.sb + y * out.sh, out, C, OW, interp, border, bval.data(), ot);
    }
  });
}

at::Tensor warp_affine_cpu(const at::Tensor& src, const at::Tensor& inv_matrix, int64_t out_h,
                           int64_t out_w, int64_t interpolation, int64_t border_mode,
                           at::ArrayRef<double> border_value) {
  const BorderValues bv =
      check_forward_args(src, inv_matrix, out_h, out_w, interpolation, border_mode, border_value);
  at::Tensor out = at::empty({src.size(0), src.size(1), out_h, out_w},
                             src.options().memory_format(output_format(src)));
  if (out.numel() == 0) return out;
  const at::Tensor mat = inv_matrix.to(at::kDouble).contiguous();
  const OutputTransform identity{};
  AT_DISPATCH_FLOATING_TYPES_AND3(at::kByte, at::kHalf, at::kBFloat16, src.scalar_type(), "warp_affine_cpu", [&] {
    warp_images<scalar_t, scalar_t>(batch_views<scalar_t>(src), mat.data_ptr<double>(), out_view<scalar_t>(out),
                                     src.size(1), out_h, out_w, interpolation, border_mode, bv, identity);
  });
  return out;
}

// The fused op on a batch tensor or on a list of HWC images: warp, then the output transform and
// the output dtype and layout, in one pass.
template <typename in_t>
void fused_dispatch(const std::vector<ImageView<in_t>>& views, const at::Tensor& mat, at::Tensor& out,
                    int64_t interp, int64_t border, const BorderValues& bv, const OutputTransform& ot) {
  const int64_t C = out.size(1), OH = out.size(2), OW = out.size(3);
  const double* m = mat.data_ptr<double>();
  switch (out.scalar_type()) {
    case at::kFloat: warp_images<in_t, float>(views, m, out_view<float>(out), C, OH, OW, interp, border, bv, ot); break;
    case at::kHalf: warp_images<in_t, at::Half>(views, m, out_view<at::Half>(out), C, OH, OW, interp, border, bv, ot); break;
    case at::kBFloat16:
      warp_images<in_t, at::BFloat16>(views, m, out_view<at::BFloat16>(out), C, OH, OW, interp, border, bv, ot);
      break;
    case at::kByte: warp_images<in_t, uint8_t>(views, m, out_view<uint8_t>(out), C, OH, OW, interp, border, bv, ot); break;
    default: TORCH_INTERNAL_ASSERT(false, "out_dtype was checked");
  }
}

at::Tensor warp_affine_fused_cpu(const at::Tensor& src, const at::Tensor& inv_matrix, int64_t out_h, int64_t out_w,
                                 int64_t interpolation, int64_t border_mode, at::ArrayRef<double> border_value,
                                 at::ScalarType out_dtype, at::ArrayRef<double> mean, at::ArrayRef<double> std,
                                 double scale, bool reverse_channels, bool channels_last_out) {
  const BorderValues bv =
      check_forward_args(src, inv_matrix, out_h, out_w, interpolation, border_mode, border_value);
  const OutputTransform ot = check_output_args(src.size(1), out_dtype, mean, std, scale, reverse_channels);
  at::Tensor out = make_fused_output(src.size(0), src.size(1), out_h, out_w, out_dtype, channels_last_out, src.device());
  if (out.numel() == 0) return out;
  const at::Tensor mat = inv_matrix.to(at::kDouble).contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND3(at::kByte, at::kHalf, at::kBFloat16, src.scalar_type(), "warp_affine_fused_cpu", [&] {
    fused_dispatch<scalar_t>(batch_views<scalar_t>(src), mat, out, interpolation, border_mode, bv, ot);
  });
  return out;
}

at::Tensor warp_affine_list_cpu(at::TensorList images, const at::Tensor& inv_matrix, int64_t out_h, int64_t out_w,
                                int64_t interpolation, int64_t border_mode, at::ArrayRef<double> border_value,
                                at::ScalarType out_dtype, at::ArrayRef<double> mean, at::ArrayRef<double> std,
                                double scale, bool reverse_channels, bool channels_last_out) {
  const BorderValues bv = check_list_args(images, inv_matrix, out_h, out_w, interpolation, border_mode, border_value);
  const int64_t C = images[0].size(2);  // check_list_args refused an empty list
  const OutputTransform ot = check_output_args(C, out_dtype, mean, std, scale, reverse_channels);
  at::Tensor out = make_fused_output(static_cast<int64_t>(images.size()), C, out_h, out_w, out_dtype,
                                     channels_last_out, inv_matrix.device());
  if (out.numel() == 0) return out;
  const at::Tensor mat = inv_matrix.to(at::kDouble).contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND3(at::kByte, at::kHalf, at::kBFloat16, images[0].scalar_type(), "warp_affine_list_cpu", [&] {
    std::vector<ImageView<scalar_t>> views;
    for (const at::Tensor& im : images) {  // HWC: element (c, y, x) at c + y * stride(0) + x * stride(1)
      views.push_back({im.data_ptr<scalar_t>(), im.size(0), im.size(1), im.stride(2), im.stride(0), im.stride(1)});
    }
    fused_dispatch<scalar_t>(views, mat, out, interpolation, border_mode, bv, ot);
  });
  return out;
}

struct Geometry {
  int64_t B, C, H, W, OH, OW;
  int64_t s0, s1, s2, s3;  // src strides (elements)
  int64_t o0, o1, o2, o3;  // grad_out strides
};

Geometry geometry(const at::Tensor& src, const at::Tensor& out) {
  return {src.size(0),   src.size(1),   src.size(2),   src.size(3),   out.size(2),   out.size(3),
          src.stride(0), src.stride(1), src.stride(2), src.stride(3), out.stride(0), out.stride(1),
          out.stride(2), out.stride(3)};
}

// Backward, one image per task (taps of different output pixels of one image may share a source
// pixel, so the image's gradient is accumulated by a single thread). The matrix gradient follows
// from d(sx)/dM = (x, y, 1) and the derivative of the tap weights in fx, fy.
template <typename scalar_t>
void backward_kernel(const at::Tensor& grad_out, const at::Tensor& src, const at::Tensor& mat,
                     at::Tensor& grad_src_acc, at::Tensor& grad_mat, int64_t interp, int64_t border,
                     const BorderValues& bv, bool need_src, bool need_mat) {
  using acc_t = acc_type<scalar_t>;
  const Geometry g = geometry(src, grad_out);
  const scalar_t* sp = src.data_ptr<scalar_t>();
  const scalar_t* gp = grad_out.data_ptr<scalar_t>();
  acc_t* gs = grad_src_acc.data_ptr<acc_t>();  // contiguous NCHW accumulator
  double* gm = grad_mat.data_ptr<double>();
  const double* mp = mat.data_ptr<double>();
  at::parallel_for(0, g.B, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const double* M = mp + b * 6;
      double dm[6] = {0, 0, 0, 0, 0, 0};
      for (int64_t y = 0; y < g.OH; ++y) {
        const double rx = row_term(M[1], M[2], y), ry = row_term(M[4], M[5], y);
        for (int64_t x = 0; x < g.OW; ++x) {
          const Taps<acc_t> t =
              make_taps(source_coord(M[0], rx, x, acc_t()), source_coord(M[3], ry, x, acc_t()), interp);
          if (!t.valid) continue;
          acc_t w[16], dwx[16], dwy[16];
          tap_weights(t, w, dwx, dwy);
          double gx = 0, gy = 0;
          for (int64_t c = 0; c < g.C; ++c) {
            const acc_t go = static_cast<acc_t>(gp[b * g.o0 + c * g.o1 + y * g.o2 + x * g.o3]);
            if (go == acc_t(0)) continue;
            for (int j = 0; j < t.n; ++j) {
              for (int i = 0; i < t.n; ++i) {
                int64_t ix = t.x0 + i, iy = t.y0 + j;
                const int k = j * t.n + i;
                // A tap on the constant border has no source pixel to send gradient to, but its
                // value still moves the output when the matrix moves the sample point.
                const bool inside = resolve_tap(ix, iy, g.H, g.W, border);
                if (inside && need_src) gs[((b * g.C + c) * g.H + iy) * g.W + ix] += w[k] * go;
                if (need_mat) {
                  const double v = inside ? double(sp[b * g.s0 + c * g.s1 + iy * g.s2 + ix * g.s3])
                                          : double(static_cast<acc_t>(Store<scalar_t, double>::cast(bv[c])));
                  gx += double(dwx[k]) * double(v) * double(go);
                  gy += double(dwy[k]) * double(v) * double(go);
                }
              }
            }
          }
          dm[0] += gx * x; dm[1] += gx * y; dm[2] += gx;
          dm[3] += gy * x; dm[4] += gy * y; dm[5] += gy;
        }
      }
      for (int k = 0; k < 6; ++k) gm[b * 6 + k] = dm[k];
    }
  });
}

std::tuple<at::Tensor, at::Tensor> warp_affine_backward_cpu(const at::Tensor& grad_out, const at::Tensor& src,
                                                            const at::Tensor& inv_matrix, int64_t interpolation,
                                                            int64_t border_mode, at::ArrayRef<double> border_value,
                                                            bool need_src_grad, bool need_matrix_grad) {
  const BorderValues bv = check_backward_args(grad_out, src, inv_matrix, interpolation, border_mode, border_value);
  const auto acc_dtype = src.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor grad_src_acc = at::zeros({src.size(0), src.size(1), src.size(2), src.size(3)},
                                      src.options().dtype(acc_dtype));
  at::Tensor grad_mat = at::zeros({src.size(0), 2, 3}, src.options().dtype(at::kDouble));
  const at::Tensor mat = inv_matrix.to(at::kDouble).contiguous();
  if (grad_out.numel() > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "warp_affine_backward_cpu", [&] {
      backward_kernel<scalar_t>(grad_out, src, mat, grad_src_acc, grad_mat, interpolation, border_mode,
                                bv, need_src_grad, need_matrix_grad);
    });
  }
  return {grad_src_acc.to(src.scalar_type()).contiguous(output_format(src)),
          grad_mat.to(inv_matrix.scalar_type())};
}

at::Tensor invert_affine_cpu(const at::Tensor& matrix) {
  check_invert_args(matrix);
  const at::Tensor m = matrix.contiguous();
  at::Tensor out = at::empty_like(m);
  const double* in = m.data_ptr<double>();
  double* o = out.data_ptr<double>();
  for (int64_t i = 0; i < m.size(0); ++i) invert_affine_2x3(in + 6 * i, o + 6 * i);
  return out;
}

}  // namespace
}  // namespace warpaffine
}  // namespace orbbec

TORCH_LIBRARY_IMPL(orbbec, CPU, m) {
  m.impl("invert_affine", &orbbec::warpaffine::invert_affine_cpu);
  m.impl("warp_affine", &orbbec::warpaffine::warp_affine_cpu);
  m.impl("warp_affine_backward", &orbbec::warpaffine::warp_affine_backward_cpu);
  m.impl("warp_affine_fused", &orbbec::warpaffine::warp_affine_fused_cpu);
  m.impl("warp_affine_list", &orbbec::warpaffine::warp_affine_list_cpu);
}
