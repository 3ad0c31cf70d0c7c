// nvJPEG's device and pinned allocations, counted. nvJPEG frees and allocates its buffers with
// cudaFree / cudaFreeHost when a batch needs more than its state holds (larger images, another batch
// size), and those calls wait for the whole device, a training step's kernels included. The counts
// (decoder_stats()["memory_calls"]) tell whether that happens in the steady state: it did not beside
// the ResNet-50 step (docs/dev/decode.md), and a test keeps it so. The allocations themselves are the
// ones nvJPEG makes by default (cudaMalloc, cudaHostAlloc).
#pragma once
#ifdef WITH_NVJPEG
#include <atomic>
#include <cstdint>

#include <cuda_runtime_api.h>
#include <nvjpeg.h>

namespace orbbec {
namespace io {

struct NvjpegMemoryCalls {
  std::atomic<int64_t> device_allocs{0}, device_frees{0}, pinned_allocs{0}, pinned_frees{0};
};

inline NvjpegMemoryCalls& nvjpeg_memory_calls() {
  static NvjpegMemoryCalls calls;
  return calls;
}

// nvJPEG reports a failed allocation only as "allocator failure": the CUDA error and the size are kept
// here, per thread (nvJPEG calls the allocator on the thread that called it), for the error message.
// A successful allocation clears it, so that a later failure of nvJPEG's own is not blamed on an
// allocation that failed long before. The failed call's error is also taken off CUDA's last-error
// slot, where a later unrelated launch check (torch's) would otherwise find it and blame itself.
struct AllocationFailure {
  const char* call = nullptr;
  size_t bytes = 0;
  cudaError_t error = cudaSuccess;
};

inline AllocationFailure& last_allocation_failure() {
  thread_local AllocationFailure failure;
  return failure;
}

inline int allocation_result(cudaError_t e, const char* call, size_t bytes) {
  if (e == cudaSuccess) {
    last_allocation_failure() = AllocationFailure{};
    return 0;
  }
  cudaGetLastError();
  last_allocation_failure() = AllocationFailure{call, bytes, e};
  return 1;
}

inline int counted_device_malloc(void** p, size_t size) {
  ++nvjpeg_memory_calls().device_allocs;
  return allocation_result(cudaMalloc(p, size), "cudaMalloc", size);
}
inline int counted_device_free(void* p) {
  ++nvjpeg_memory_calls().device_frees;
  return cudaFree(p) == cudaSuccess ? 0 : 1;
}
inline int counted_pinned_malloc(void** p, size_t size, unsigned int flags) {
  ++nvjpeg_memory_calls().pinned_allocs;
  return allocation_result(cudaHostAlloc(p, size, flags), "cudaHostAlloc", size);
}
inline int counted_pinned_free(void* p) {
  ++nvjpeg_memory_calls().pinned_frees;
  return cudaFreeHost(p) == cudaSuccess ? 0 : 1;
}

inline nvjpegDevAllocator_t* counted_device_allocator() {
  static nvjpegDevAllocator_t a{&counted_device_malloc, &counted_device_free};
  return &a;
}
inline nvjpegPinnedAllocator_t* counted_pinned_allocator() {
  static nvjpegPinnedAllocator_t a{&counted_pinned_malloc, &counted_pinned_free};
  return &a;
}

}  // namespace io
}  // namespace orbbec
#endif  // WITH_NVJPEG
