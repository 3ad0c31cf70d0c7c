// The suppression mask's layout and the greedy rule inside one 64-box tile, shared by both CUDA
// nms paths.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "nms/src/common/nms.h"

namespace orbbec {
namespace nms {

using Word = unsigned long long;  // one mask word: the type __popcll and __ffsll take

// Mask layout: row tile b (boxes 64b .. 64b+63) stores, for each of its 64 rows, the words of
// column tiles b .. W-1 only: W - b words per row. Half the memory of the full square.
__host__ __device__ __forceinline__ int64_t tile_base(int64_t b, int64_t W) {
  return int64_t(kTile) * (b * W - b * (b - 1) / 2);
}
__device__ __forceinline__ int64_t row_offset(int64_t r, int64_t W) {
  const int64_t b = r / kTile;
  return tile_base(b, W) + (r % kTile) * (W - b);
}

// OR of x over the warp, returned to every lane (all 32 lanes call it).
__device__ __forceinline__ Word warp_or(Word x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned int lo = __reduce_or_sync(0xffffffffu, static_cast<unsigned int>(x));
  const unsigned int hi = __reduce_or_sync(0xffffffffu, static_cast<unsigned int>(x >> 32));
  return (Word(hi) << 32) | lo;
#else
  for (int offset = 16; offset > 0; offset >>= 1) x |= __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
#endif
}

// The boxes of one 64-box tile that the greedy rule keeps, from the candidates (not removed by
// earlier tiles) and the tile's diagonal words (lane l holds rows l and l + 32). Instead of one
// step per kept box, rounds: a candidate that no other candidate suppresses is certainly kept
// (only kept boxes suppress, and every kept box is a candidate); the boxes those suppress go.
// The lowest candidate is kept in every round, so rounds end; there are as many as the longest
// chain of suppressions among the candidates, usually one or two.
__device__ __forceinline__ Word settle_tile(Word cand, Word diag_lo, Word diag_hi, int lane) {
  Word kept = 0;
  while (cand != 0) {
    const Word by_cand = warp_or(((cand >> lane) & 1 ? diag_lo : 0) | ((cand >> (lane + 32)) & 1 ? diag_hi : 0));
    const Word sure = cand & ~by_cand;
    kept |= sure;
    const Word by_sure = warp_or(((sure >> lane) & 1 ? diag_lo : 0) | ((sure >> (lane + 32)) & 1 ? diag_hi : 0));
    cand &= ~sure & ~by_sure;
  }
  return kept;
}

}  // namespace nms
}  // namespace orbbec
