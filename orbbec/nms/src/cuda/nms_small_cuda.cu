// nms and batched_nms of a few hundred boxes in one block and one launch.
//
// For small inputs the general path's cost is not arithmetic but launches: a stable sort (several
// kernels and allocations), the gather, the mask and the scan, and reading the count back through
// a copy. Here one block ranks the boxes by counting (the order of the stable sort and of
// ranks_before), gathers them into shared memory in rank order, computes the upper-triangle
// suppression mask there (one warp ballot per 32 pairs) and runs the greedy pass in one warp.
// The decisions are those of the general path: the same box arithmetic (common/nms.h), the same
// ranking, the same greedy rule.
#include <mutex>
#include <vector>

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAFunctions.h>

#include "common/src/cuda_utils.cuh"
#include "nms/src/common/nms.h"
#include "nms/src/cuda/nms_small.h"
#include "nms/src/cuda/suppression_mask.cuh"

namespace orbbec {
namespace nms {
namespace {

constexpr int kSmallThreads = 1024;

// Largest n taken here, per accumulation type: keeps the block's static shared memory (boxes,
// areas, keys, classes, order and the mask triangle) under 48 KB.
template <typename T> constexpr int small_max() { return sizeof(T) == 4 ? 512 : 256; }
static_assert(small_max<float>() <= kSmallThreads, "the kernel loads one box per thread");

// An unsigned key whose order is ranks_before's order of scores: larger key, earlier rank. NaN
// above every number, -0 equal to +0 (as the comparisons of ranks_before treat them).
__device__ __forceinline__ unsigned int score_key(float s) {
  if (s != s) return 0xffffffffu;
  const unsigned int u = __float_as_uint(s == 0.f ? 0.f : s);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ unsigned long long score_key(double s) {
  if (s != s) return ~0ull;
  const unsigned long long u = static_cast<unsigned long long>(__double_as_longlong(s == 0.0 ? 0.0 : s));
  return (u & (1ull << 63)) ? ~u : (u | (1ull << 63));
}

// Rank key of box i: float scores carry the index in the low half (ties by lower index), so one
// comparison decides; double scores compare (key, index) in two steps.
template <typename T> struct RankKey;
template <> struct RankKey<float> {
  unsigned long long k;
  __device__ static RankKey make(float s, int i) {
    return {(static_cast<unsigned long long>(score_key(s)) << 32) | (0xffffffffu - static_cast<unsigned int>(i))};
  }
  __device__ bool before(const RankKey& o) const { return k > o.k; }
};
template <> struct RankKey<double> {
  unsigned long long k;
  int i;
  __device__ static RankKey make(double s, int i) { return {score_key(s), i}; }
  __device__ bool before(const RankKey& o) const { return k > o.k || (k == o.k && i < o.i); }
};

template <typename scalar_t, typename T>
__global__ void __launch_bounds__(kSmallThreads) small_nms_kernel(
    const scalar_t* __restrict__ boxes, int64_t box_stride0, int64_t box_stride1,
    const scalar_t* __restrict__ scores, int64_t score_stride, const int64_t* __restrict__ cls, int n, T thr,
    int64_t* __restrict__ out_idx, int64_t* __restrict__ out_count) {
  constexpr int kMax = small_max<T>();
  constexpr int kMaxW = kMax / kTile;
  __shared__ RankKey<T> s_key[kMax];
  __shared__ int s_rank[kMax];
  __shared__ Box<T> s_box[kMax];  // rank order from here on
  __shared__ T s_area[kMax];
  __shared__ int64_t s_cls[kMax];
  __shared__ short s_order[kMax];
  __shared__ Word s_mask[kTile * kMaxW * (kMaxW + 1) / 2];
  __shared__ Word s_removed[kMaxW];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
  const int W = (n + kTile - 1) / kTile;

  // Every input in one global round trip: thread i < n (n <= blockDim.x) holds box i until its
  // rank is known.
  Box<T> my_box{};
  int64_t my_cls = 0;
  if (tid < n) {
    const scalar_t* q = boxes + tid * box_stride0;
    my_box = Box<T>{static_cast<T>(q[0]), static_cast<T>(q[box_stride1]), static_cast<T>(q[2 * box_stride1]),
                    static_cast<T>(q[3 * box_stride1])};
    if (cls != nullptr) my_cls = cls[tid];
    s_key[tid] = RankKey<T>::make(static_cast<T>(scores[tid * score_stride]), tid);
    s_rank[tid] = 0;
  }
  if (tid < W) s_removed[tid] = 0;
  __syncthreads();

  // Rank of box i: how many keys come before its own. Thread t counts part t / n of the keys for
  // box t % n, so every thread has work.
  {
    const int parts = blockDim.x / n, part = tid / n, i = tid % n;
    if (part < parts) {
      const RankKey<T> ki = s_key[i];
      const int len = (n + parts - 1) / parts, j_end = min(n, (part + 1) * len);
      int count = 0;
      for (int j = part * len; j < j_end; ++j) count += s_key[j].before(ki);
      atomicAdd(&s_rank[i], count);
    }
  }
  __syncthreads();
  if (tid < n) {
    const int rank = s_rank[tid];
    s_area[rank] = sanitize(my_box);
    s_box[rank] = my_box;
    s_order[rank] = static_cast<short>(tid);
    s_cls[rank] = my_cls;
  }
  __syncthreads();

  // Mask, one warp per row r: lane l tests column 32 h + l for each half-tile h on or right of
  // r's tile, and the warp's ballot is that half of row r's word. Bit c of word (j - r / 64) says
  // box r suppresses box 64 j + c (a later-ranked box). Most pairs do not intersect, so iou's
  // division (skipped for an empty intersection) runs for few lanes.
  unsigned int* mask32 = reinterpret_cast<unsigned int*>(s_mask);  // little-endian halves of a Word
  for (int r = warp; r < n; r += warps) {
    const Box<T> rb = s_box[r];
    const T ra = s_area[r];
    const int64_t rc = cls != nullptr ? s_cls[r] : 0;
    unsigned int* row = mask32 + 2 * row_offset(r, W);
    for (int h = 2 * (r / kTile); h < 2 * W; ++h) {
      const int c = 32 * h + lane;
      bool hit = false;
      if (c > r && c < n && (cls == nullptr || s_cls[c] == rc)) hit = iou(rb, ra, s_box[c], s_area[c]) > thr;
      const unsigned int bits = __ballot_sync(0xffffffffu, hit);
      if (lane == 0) row[h - 2 * (r / kTile)] = bits;
    }
  }
  __syncthreads();

  // The greedy pass in warp 0, one 64-box tile at a time (settle_tile). Then the tile's kept rows
  // remove boxes of later tiles: lane l contributes rows l and l + 32 when kept and one warp OR
  // per later tile gathers them (a loop over the kept rows instead cost one dependent shared load
  // per kept box, most of the kernel's time at 100 boxes).
  if (warp != 0) return;
  int64_t total = 0;
  for (int b = 0; b < W; ++b) {
    const int r0 = b * kTile;
    const int rows = min(kTile, n - r0);
    const Word valid = rows == kTile ? ~Word(0) : (Word(1) << rows) - 1;
    const int64_t row_lo = row_offset(r0 + lane, W), row_hi = row_offset(r0 + lane + 32, W);
    const Word diag_lo = lane < rows ? s_mask[row_lo] : 0;
    const Word diag_hi = lane + 32 < rows ? s_mask[row_hi] : 0;
    const Word kept = settle_tile(~s_removed[b] & valid, diag_lo, diag_hi, lane);
    for (int t = lane; t < rows; t += 32) {
      if ((kept >> t) & 1) out_idx[total + __popcll(kept & ((Word(1) << t) - 1))] = s_order[r0 + t];
    }
    total += __popcll(kept);
    const bool kept_lo = (kept >> lane) & 1, kept_hi = (kept >> (lane + 32)) & 1;  // 0 past row n - 1
    for (int w = b + 1; w < W; ++w) {
      const Word by_kept = warp_or((kept_lo ? s_mask[row_lo + (w - b)] : 0) | (kept_hi ? s_mask[row_hi + (w - b)] : 0));
      if (lane == 0) s_removed[w] |= by_kept;
    }
    __syncwarp();
  }
  if (lane == 0) *out_count = total;
}

// A pinned, device-mapped host slot for one call's kept count, taken from a pool and given back
// when the call ends: the kernel writes the count straight into host memory, so reading it back
// costs the stream synchronisation and neither a copy nor a pinned allocation (through the caching
// host allocator) per call.
class CountSlot {
 public:
  CountSlot() {
    {
      std::lock_guard<std::mutex> lock(mutex());
      if (!pool().empty()) {
        host_ = pool().back();
        pool().pop_back();
      }
    }
    if (host_ == nullptr && cudaHostAlloc(reinterpret_cast<void**>(&host_), sizeof(int64_t),
                                          cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the error: the caller falls back to a device slot
      host_ = nullptr;
    }
    if (host_ != nullptr &&
        cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      device_ = nullptr;
    }
  }
  ~CountSlot() {
    if (host_ == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex());
    pool().push_back(host_);
  }
  CountSlot(const CountSlot&) = delete;
  CountSlot& operator=(const CountSlot&) = delete;

  int64_t* device() const { return device_; }  // nullptr: the device cannot write to it
  int64_t read() const { return *static_cast<volatile int64_t*>(host_); }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<int64_t*>& pool() {  // lives as long as the process, like the CUDA context
    static auto* p = new std::vector<int64_t*>();
    return *p;
  }
  int64_t* host_ = nullptr;
  int64_t* device_ = nullptr;
};

}  // namespace

bool small_nms_applies(const at::Tensor& boxes, const at::Tensor& scores) {
  if (scores.scalar_type() != boxes.scalar_type()) return false;
  const int64_t limit = boxes.scalar_type() == at::kDouble ? small_max<double>() : small_max<float>();
  return boxes.size(0) <= limit;
}

at::Tensor small_nms_cuda(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
                          double iou_threshold) {
  const int n = static_cast<int>(boxes.size(0));
  at::Tensor out = at::empty({n}, boxes.options().dtype(at::kLong));
  const CountSlot slot;
  at::Tensor device_count;  // only where the pinned slot cannot be written by the device
  int64_t* count_on_device = slot.device();
  if (count_on_device == nullptr) {
    device_count = at::empty({1}, out.options());
    count_on_device = device_count.data_ptr<int64_t>();
  }
  const at::Tensor cls = idxs.defined() ? idxs.to(at::kLong).contiguous() : at::Tensor();
  const cudaStream_t stream = current_stream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, boxes.scalar_type(), "orbbec_small_nms_cuda", [&] {
    using T = acc_type<scalar_t>;
    small_nms_kernel<scalar_t, T><<<1, kSmallThreads, 0, stream>>>(
        boxes.data_ptr<scalar_t>(), boxes.stride(0), boxes.stride(1), scores.data_ptr<scalar_t>(), scores.stride(0),
        cls.defined() ? cls.data_ptr<int64_t>() : nullptr, n, threshold_below<T>(iou_threshold),
        out.data_ptr<int64_t>(), count_on_device);
    ORBBEC_LAUNCH_CHECK();
  });
  int64_t kept = 0;  // the one host sync: the output size
  if (device_count.defined()) {
    c10::cuda::memcpy_and_sync(&kept, count_on_device, sizeof(kept), cudaMemcpyDeviceToHost, stream);
  } else {
    c10::cuda::stream_synchronize(stream);
    kept = slot.read();
  }
  return out.narrow(0, 0, kept);
}

}  // namespace nms
}  // namespace orbbec
