// The AVX2 row kernel of the CPU warp for uint8 -> uint8 nearest, 1 or 3 channels, every border
// mode, chosen at run time by warpaffine_cpu.cpp. Included by warpaffine_cpu.cpp only.
#pragma once
#if defined(__x86_64__) && defined(__GNUC__)
#include "warpaffine/src/cpu/avx2_lanes.h"

namespace orbbec {
namespace warpaffine {
namespace {

// Eight output pixels per step: the two rounded source coordinates (make_taps: rint, half to
// even, as cvtps rounds), folded into the image by the border rule, and one 32-bit read per pixel
// (its three channels when interleaved) or per pixel and plane. A lane reads the border value where
// its coordinates are not finite or too far, or where the constant border's tap is off the image.
// Lanes that one fold does not bring inside (taps more than an image length off) or whose read
// would run past the image's end go to the scalar code after the vector store.
struct NearestAvx2 {
  template <int CN, bool PACKED_IN, bool PACKED_OUT>
  __attribute__((target("avx2"))) static void run(const RowJob& r) {
    const ImageView<uint8_t>& im = r.im;
    const RowCoords rc = row_coords(r.M, r.y);
    const __m256i sh = _mm256_set1_epi32(static_cast<int>(im.sh)), sw = _mm256_set1_epi32(PACKED_IN ? 3 : 1);
    const __m256i max_off = _mm256_set1_epi32(last_read_offset(im, PACKED_IN));
    __m256i fill[PACKED_IN ? 1 : CN];
    border_words<CN, PACKED_IN>(r.bval, fill);

    int64_t x = 0;
    for (; x + 8 <= r.OW; x += 8) {
      const __m256 sx = source_coords8(rc.m0, rc.row_x, x), sy = source_coords8(rc.m3, rc.row_y, x);
      const __m256i valid = coords_ok8(sx, sy);
      const __m256i col = border_fold8(_mm256_cvtps_epi32(sx), im.W, r.border);
      const __m256i row = border_fold8(_mm256_cvtps_epi32(sy), im.H, r.border);
      const __m256i off = _mm256_add_epi32(_mm256_mullo_epi32(row, sh), _mm256_mullo_epi32(col, sw));
      const __m256i tap_in = _mm256_and_si256(valid, _mm256_and_si256(in_range8(col, im.W), in_range8(row, im.H)));
      const __m256i read = _mm256_andnot_si256(_mm256_cmpgt_epi32(off, max_off), tap_in);
      // Not read and not the border value: a constant border's inside tap past the last safe
      // read, or another mode's valid pixel the fold left outside.
      const int scalar_bits = lane_bits(r.border == kConstant ? tap_in : valid) & ~lane_bits(read);
      if (PACKED_IN && PACKED_OUT) {
        store_pixels_packed(r.orow + 3 * x, gather8(im.data, off, read, fill[0]));
      } else {
        __m256i c[CN];
        if (PACKED_IN) {
          const __m256i pixels = gather8(im.data, off, read, fill[0]);
          for (int k = 0; k < CN; ++k) c[k] = byte_of(pixels, k);
        } else {
          for (int k = 0; k < CN; ++k) c[k] = byte_of(gather8(im.data + k * im.sc, off, read, fill[k]), 0);
        }
        store_channels<CN, PACKED_OUT>(r.orow, r.out.sc, x, c);
      }
      scalar_lanes<CN>(scalar_bits, r, x);
    }
    scalar_span<CN>(r, x, r.OW);
  }
};

}  // namespace
}  // namespace warpaffine
}  // namespace orbbec
#endif  // x86_64 with GCC or Clang
