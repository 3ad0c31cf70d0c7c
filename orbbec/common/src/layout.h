// The output-layout rule every op follows (host code): an output, and the gradient of an input,
// keep channels_last when the input is channels_last; everything else comes out contiguous NCHW.
// orbbec/_layout.py states the same rule for the fake kernels.
#pragma once
#include <torch/types.h>

namespace orbbec {

// channels_last when `t` ([N, C, H, W]) is laid out channels_last and not also contiguous (a
// 1-channel tensor, or one with H = W = 1, is both: it stays contiguous).
inline at::MemoryFormat output_format(const at::Tensor& t) {
  if (t.size(1) > 1 && t.is_contiguous(at::MemoryFormat::ChannelsLast) && !t.is_contiguous()) {
    return at::MemoryFormat::ChannelsLast;
  }
  return at::MemoryFormat::Contiguous;
}

}  // namespace orbbec
