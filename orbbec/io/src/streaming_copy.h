// A copy whose stores bypass the CPU caches (x86 streaming stores), for the loader's workers' copy of
// a batch's JPEG bytes into a shared slot: nothing on the host reads those bytes again before the
// GPU's DMA does, and an ordinary copy first reads each destination line (read-for-ownership) and
// leaves the whole batch in the caches, which the decoder's own host work shares. Whether that
// traffic slows the decoder is an open experiment (docs/dev/decode.md, "Open"): pack_buffers takes
// this copy only under ORBBEC_PACK_STREAMING=1. Elsewhere than x86 it is memcpy.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace orbbec {
namespace io {

// Copies n bytes; call streaming_copy_done() once after the last copy, before another thread or
// process is told the bytes are there (streaming stores are weakly ordered).
inline void streaming_copy(uint8_t* dst, const uint8_t* src, size_t n) {
#if defined(__SSE2__)
  const size_t head = std::min(n, (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15);
  std::memcpy(dst, src, head);  // up to the destination's first 16-byte boundary
  dst += head;
  src += head;
  n -= head;
  for (; n >= 64; n -= 64, src += 64, dst += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
  }
#endif
  std::memcpy(dst, src, n);  // the tail (or everything without SSE2)
}

inline void streaming_copy_done() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace io
}  // namespace orbbec
