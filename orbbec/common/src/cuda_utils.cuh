// Launch helpers shared by the CUDA kernels of every op.
#pragma once
#include <algorithm>
#include <cstdint>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

namespace orbbec {

// Grid size for a grid-stride loop over n items: enough blocks to fill the GPU a few times
// over, never more than the items need. Kernels loop, so a capped grid still covers every item.
inline unsigned int grid_for(int64_t n, int threads) {
  const int64_t blocks_needed = (n + threads - 1) / threads;
  const int64_t cap = int64_t(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 32;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min(blocks_needed, cap)));
}

}  // namespace orbbec

#define ORBBEC_LAUNCH_CHECK() C10_CUDA_KERNEL_LAUNCH_CHECK()
