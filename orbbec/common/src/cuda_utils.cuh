// Launch helpers shared by the CUDA kernels of every op. Only c10/cuda headers are used (not
// ATen/cuda/CUDAContext.h, which pulls in cuBLAS and cuSPARSE headers), so the kernels also
// compile on a build machine whose CUDA toolkit has just the compiler and runtime.
#pragma once
#include <algorithm>
#include <cstdint>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

namespace orbbec {

inline int multiprocessor_count() {
  int device = 0, count = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

// Grid size for a grid-stride loop over n items: enough blocks to fill the GPU a few times
// over, never more than the items need. Kernels loop, so a capped grid still covers every item.
inline unsigned int grid_for(int64_t n, int threads) {
  const int64_t blocks_needed = (n + threads - 1) / threads;
  const int64_t cap = int64_t(multiprocessor_count()) * 32;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min(blocks_needed, cap)));
}

inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

}  // namespace orbbec

#define ORBBEC_LAUNCH_CHECK() C10_CUDA_KERNEL_LAUNCH_CHECK()
