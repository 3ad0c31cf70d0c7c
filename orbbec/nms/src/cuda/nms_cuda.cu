// CUDA kernels of nms, batched_nms and soft_nms.
//
// nms: boxes sorted by score (stable) -> suppression mask of 64x64-box tiles, one bit per pair,
// only for the tiles on or above the diagonal (a box can only be suppressed by a higher-ranked one)
// -> one block walks the mask in rank order with the 'removed' bitset in shared memory and writes
// the kept indices itself. No mask goes to the host: the one host sync reads how many were kept.
// batched_nms: the same on boxes sorted by (class, score), so every class is a contiguous run;
// tiles whose rows and columns share no class are neither computed nor read.
// Up to a few hundred boxes both take one launch instead (nms_small_cuda.cu).
#include <tuple>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include "common/src/cuda_utils.cuh"
#include "nms/src/cuda/nms_small.h"
#include "nms/src/cuda/suppression_mask.cuh"
#include "nms/src/nms_ext.h"

namespace orbbec {
namespace nms {
namespace {

constexpr int kGatherThreads = 256;
constexpr int kScanThreads = 1024;
constexpr int kSoftThreads = 1024;
// The scan keeps 'removed' (one bit per box) in shared memory up to this many words
// (327,680 boxes); beyond, in global memory.
constexpr int64_t kMaxSharedWords = 40 * 1024 / sizeof(Word);

// Sorted, sanitized boxes in the accumulation type: out[k] = boxes[order[k]] (order null: k).
template <typename scalar_t, typename T>
__global__ void gather_boxes_kernel(const scalar_t* __restrict__ boxes, const int64_t* __restrict__ order,
                                    int64_t n, Box<T>* __restrict__ out, T* __restrict__ area) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(blockDim.x) * gridDim.x) {
    const scalar_t* q = boxes + (order != nullptr ? order[k] : k) * 4;
    Box<T> b{static_cast<T>(q[0]), static_cast<T>(q[1]), static_cast<T>(q[2]), static_cast<T>(q[3])};
    area[k] = sanitize(b);
    out[k] = b;
  }
}

// col_end[b]: last column tile holding a box of the class of row tile b's last box. Classes are
// sorted, so tiles b .. col_end[b] are exactly those that can share a class with tile b.
__global__ void class_end_kernel(const int64_t* __restrict__ cls, int64_t n, int64_t W, int64_t* __restrict__ col_end) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < W; b += int64_t(blockDim.x) * gridDim.x) {
    const int64_t r = min(b * kTile + kTile - 1, n - 1);
    const int64_t c = cls[r];
    int64_t lo = r + 1, hi = n;  // first position after r whose class differs
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (cls[mid] == c) lo = mid + 1; else hi = mid;
    }
    col_end[b] = (lo - 1) / kTile;
  }
}

// One block per tile (i, j), j >= i; thread t computes row 64i + t's word for column tile j.
// The triangle is folded so the grid is a rectangle: block row y holds tile rows y and W-1-y.
template <typename T, bool kByClass>
__global__ void __launch_bounds__(kTile) mask_kernel(const Box<T>* __restrict__ boxes, const T* __restrict__ area,
                                                     const int64_t* __restrict__ cls,
                                                     const int64_t* __restrict__ col_end, int64_t n, int64_t W,
                                                     T thr, Word* __restrict__ mask) {
  const int64_t y = blockIdx.y, x = blockIdx.x;
  int64_t i, j;
  if (x < W - y) {
    i = y;
    j = y + x;
  } else {
    i = W - 1 - y;
    if (i == y) return;  // middle row of an odd W: already covered by the first half
    j = i + (x - (W - y));
  }
  if (kByClass && j > col_end[i]) return;

  __shared__ Box<T> col_box[kTile];
  __shared__ T col_area[kTile];
  __shared__ int64_t col_cls[kTile];
  const int t = threadIdx.x;
  const int64_t c0 = j * kTile;
  const int ncols = static_cast<int>(min(int64_t(kTile), n - c0));
  if (t < ncols) {
    col_box[t] = boxes[c0 + t];
    col_area[t] = area[c0 + t];
    if (kByClass) col_cls[t] = cls[c0 + t];
  }
  __syncthreads();
  const int64_t r = i * kTile + t;
  if (r >= n) return;
  const Box<T> rb = boxes[r];
  const T ra = area[r];
  const int64_t rc = kByClass ? cls[r] : 0;
  Word bits = 0;
  for (int c = (i == j) ? t + 1 : 0; c < ncols; ++c) {
    if (kByClass && col_cls[c] != rc) continue;
    if (iou(rb, ra, col_box[c], col_area[c]) > thr) bits |= Word(1) << c;
  }
  mask[row_offset(r, W) + (j - i)] = bits;
}

// Diagonal words (row tile b, column tile b) of rows 64b + lane and 64b + lane + 32.
__device__ __forceinline__ void load_diagonal(const Word* mask, int64_t n, int64_t W, int64_t b, int lane,
                                              Word& lo, Word& hi) {
  const int64_t r_lo = b * kTile + lane, r_hi = r_lo + 32;
  lo = r_lo < n ? mask[row_offset(r_lo, W)] : 0;
  hi = r_hi < n ? mask[row_offset(r_hi, W)] : 0;
}

// The greedy pass, on the GPU. For each row tile b in rank order: warp 0 settles the tile's boxes
// from removed[b] (set by kept boxes of earlier tiles) and the diagonal words (settle_tile); then
// every thread ORs the kept rows into one later word of 'removed'. Kept boxes go either
// straight to out_idx (in rank order) or, for batched_nms, to keep_flag[flag_pos[k]].
__global__ void __launch_bounds__(kScanThreads) scan_kernel(
    const Word* __restrict__ mask, int64_t n, int64_t W, const int64_t* __restrict__ col_end,
    const int64_t* __restrict__ order, int64_t* __restrict__ out_idx, const int64_t* __restrict__ flag_pos,
    bool* __restrict__ keep_flag, int64_t* __restrict__ out_count, Word* removed_global) {
  extern __shared__ Word removed_shared[];
  Word* removed = removed_global != nullptr ? removed_global : removed_shared;
  __shared__ int kept_rows[kTile];
  __shared__ int kept_count;
  const int tid = threadIdx.x, lane = tid & 31;
  const bool leader = tid < 32;

  for (int64_t w = tid; w < W; w += blockDim.x) removed[w] = 0;
  Word diag_lo = 0, diag_hi = 0;
  if (leader) load_diagonal(mask, n, W, 0, lane, diag_lo, diag_hi);
  int64_t total = 0;  // kept so far; meaningful in warp 0
  __syncthreads();

  for (int64_t b = 0; b < W; ++b) {
    const int64_t r0 = b * kTile;
    if (leader) {
      const int rows = static_cast<int>(min(int64_t(kTile), n - r0));
      const Word valid = rows == kTile ? ~Word(0) : (Word(1) << rows) - 1;
      const Word kept = settle_tile(~removed[b] & valid, diag_lo, diag_hi, lane);
      // The next tile's diagonal does not depend on this one: load it now, under the OR phase.
      if (b + 1 < W) load_diagonal(mask, n, W, b + 1, lane, diag_lo, diag_hi);
      for (int half = 0; half < 2; ++half) {
        const int t = lane + 32 * half;
        if (t >= rows) continue;
        const bool is_kept = (kept >> t) & 1;
        if (is_kept) {
          const int pos = __popcll(kept & ((Word(1) << t) - 1));
          kept_rows[pos] = t;
          if (out_idx != nullptr) out_idx[total + pos] = order[r0 + t];
        }
        if (keep_flag != nullptr) keep_flag[flag_pos[r0 + t]] = is_kept;
      }
      total += __popcll(kept);
      if (lane == 0) kept_count = __popcll(kept);
    }
    __syncthreads();
    const int nk = kept_count;
    if (nk > 0) {
      const int64_t last = col_end != nullptr ? col_end[b] : W - 1;
      const int64_t stride = W - b;
      const Word* rows_b = mask + tile_base(b, W);
      for (int64_t w = b + 1 + tid; w <= last; w += blockDim.x) {
        Word acc = 0;
#pragma unroll 8
        for (int k = 0; k < nk; ++k) acc |= rows_b[kept_rows[k] * stride + (w - b)];  // independent loads
        removed[w] |= acc;
      }
    }
    __syncthreads();
  }
  if (tid == 0) *out_count = total;
}

// Mask + scan over the boxes taken in `order` (rank position -> box index). Without classes,
// returns the kept box indices in rank order. With classes (cls_sorted: class per rank position,
// ascending), writes keep_flag[flag_pos[k]] for every rank position k and returns an undefined tensor.
at::Tensor suppress(const at::Tensor& boxes, const at::Tensor& order, const at::Tensor& cls_sorted,
                    const at::Tensor& flag_pos, const at::Tensor& keep_flag, double iou_threshold) {
  const int64_t n = order.size(0);
  const int64_t W = (n + kTile - 1) / kTile;
  ORBBEC_CHECK_VALUE((W + 1) / 2 <= 65535, "orbbec: CUDA nms supports up to ", 65535 * 2 * kTile,
                     " boxes, got ", n);
  const bool by_class = cls_sorted.defined();
  const cudaStream_t stream = current_stream();
  const auto opts = boxes.options();
  const at::Tensor boxes_c = boxes.contiguous();
  at::Tensor mask = at::empty({kTile * (W * (W + 1) / 2)}, opts.dtype(at::kLong));
  Word* mask_ptr = reinterpret_cast<Word*>(mask.data_ptr<int64_t>());

  at::Tensor col_end;
  if (by_class) {
    col_end = at::empty({W}, opts.dtype(at::kLong));
    class_end_kernel<<<grid_for(W, 256), 256, 0, stream>>>(cls_sorted.data_ptr<int64_t>(), n, W,
                                                           col_end.data_ptr<int64_t>());
    ORBBEC_LAUNCH_CHECK();
  }

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, boxes.scalar_type(), "orbbec_nms_cuda", [&] {
    using T = acc_type<scalar_t>;
    const auto acc_opts = opts.dtype(c10::CppTypeToScalarType<T>::value);
    at::Tensor sorted = at::empty({n, 4}, acc_opts);
    at::Tensor area = at::empty({n}, acc_opts);
    Box<T>* sorted_ptr = reinterpret_cast<Box<T>*>(sorted.data_ptr<T>());
    gather_boxes_kernel<scalar_t, T><<<grid_for(n, kGatherThreads), kGatherThreads, 0, stream>>>(
        boxes_c.data_ptr<scalar_t>(), order.data_ptr<int64_t>(), n, sorted_ptr, area.data_ptr<T>());
    ORBBEC_LAUNCH_CHECK();
    const dim3 grid(static_cast<unsigned int>(W + 1), static_cast<unsigned int>((W + 1) / 2));
    const T thr = threshold_below<T>(iou_threshold);
    if (by_class) {
      mask_kernel<T, true><<<grid, kTile, 0, stream>>>(sorted_ptr, area.data_ptr<T>(), cls_sorted.data_ptr<int64_t>(),
                                                       col_end.data_ptr<int64_t>(), n, W, thr, mask_ptr);
    } else {
      mask_kernel<T, false><<<grid, kTile, 0, stream>>>(sorted_ptr, area.data_ptr<T>(), nullptr, nullptr, n, W,
                                                        thr, mask_ptr);
    }
    ORBBEC_LAUNCH_CHECK();
  });

  at::Tensor count = at::empty({1}, opts.dtype(at::kLong));
  at::Tensor out = by_class ? at::Tensor() : at::empty({n}, opts.dtype(at::kLong));
  at::Tensor removed_global;
  size_t smem = static_cast<size_t>(W) * sizeof(Word);
  if (W > kMaxSharedWords) {
    removed_global = at::empty({W}, opts.dtype(at::kLong));
    smem = 0;
  }
  scan_kernel<<<1, kScanThreads, smem, stream>>>(
      mask_ptr, n, W, by_class ? col_end.data_ptr<int64_t>() : nullptr, order.data_ptr<int64_t>(),
      by_class ? nullptr : out.data_ptr<int64_t>(), by_class ? flag_pos.data_ptr<int64_t>() : nullptr,
      by_class ? keep_flag.data_ptr<bool>() : nullptr, count.data_ptr<int64_t>(),
      removed_global.defined() ? reinterpret_cast<Word*>(removed_global.data_ptr<int64_t>()) : nullptr);
  ORBBEC_LAUNCH_CHECK();
  if (by_class) return at::Tensor();
  const int64_t kept = count.item<int64_t>();  // the one host sync: the output size
  return out.narrow(0, 0, kept);
}

at::Tensor nms_cuda(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  check_nms_args(boxes, scores, iou_threshold);
  const c10::cuda::CUDAGuard guard(boxes.device());
  if (boxes.size(0) == 0) return at::empty({0}, boxes.options().dtype(at::kLong));
  if (small_nms_applies(boxes, scores)) return small_nms_cuda(boxes, scores, at::Tensor(), iou_threshold);
  return suppress(boxes, sort_by_score(scores), at::Tensor(), at::Tensor(), at::Tensor(), iou_threshold);
}

at::Tensor batched_nms_cuda(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
                            double iou_threshold) {
  check_batched_args(boxes, scores, idxs, iou_threshold);
  const c10::cuda::CUDAGuard guard(boxes.device());
  const int64_t n = boxes.size(0);
  if (n == 0) return at::empty({0}, boxes.options().dtype(at::kLong));
  if (small_nms_applies(boxes, scores)) return small_nms_cuda(boxes, scores, idxs, iou_threshold);
  const ClassOrder co = class_order(scores, idxs);
  const at::Tensor &by_score = co.by_score, &cls_sorted = co.cls_sorted, &by_class = co.by_class, &order = co.order;
  at::Tensor keep_by_score = at::empty({n}, boxes.options().dtype(at::kBool));
  suppress(boxes, order, cls_sorted, by_class, keep_by_score, iou_threshold);
  // nonzero reads its count back: the one host sync
  return by_score.index_select(0, at::nonzero(keep_by_score).view({-1}));
}

// Best (score, index) of the block by ranks_before, returned to every thread.
template <typename T>
__device__ int64_t block_best(T s, int64_t i, T* warp_s, int64_t* warp_i, int64_t* result) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int off = 16; off > 0; off >>= 1) {
    const T os = __shfl_down_sync(0xffffffffu, s, off);
    const int64_t oi = __shfl_down_sync(0xffffffffu, i, off);
    if (ranks_before(os, oi, s, i)) { s = os; i = oi; }
  }
  if (lane == 0) { warp_s[warp] = s; warp_i[warp] = i; }
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x >> 5;
    s = lane < warps ? warp_s[lane] : T(0);
    i = lane < warps ? warp_i[lane] : -1;
    for (int off = 16; off > 0; off >>= 1) {
      const T os = __shfl_down_sync(0xffffffffu, s, off);
      const int64_t oi = __shfl_down_sync(0xffffffffu, i, off);
      if (ranks_before(os, oi, s, i)) { s = os; i = oi; }
    }
    if (lane == 0) *result = i;
  }
  __syncthreads();
  return *result;
}

// Soft-NMS in one block: each iteration decays the remaining boxes against the selected one and
// finds the next selection in the same pass (the same rule as the CPU kernel, see nms_cpu.cpp).
// Box j is always handled by thread j % blockDim.x, so score[j] and alive[j] need no syncs.
template <typename T>
__global__ void __launch_bounds__(kSoftThreads) soft_nms_kernel(
    const Box<T>* __restrict__ boxes, const T* __restrict__ area, T* __restrict__ score,
    uint8_t* __restrict__ alive, int64_t n, int64_t method, T nt, T sigma, T drop_below,
    int64_t* __restrict__ out_idx, T* __restrict__ out_score, int64_t* __restrict__ out_count) {
  __shared__ T warp_s[32];
  __shared__ int64_t warp_i[32];
  __shared__ int64_t selected;
  const int tid = threadIdx.x;
  T bs = T(0);
  int64_t bi = -1;
  for (int64_t j = tid; j < n; j += blockDim.x) {
    alive[j] = 1;
    if (ranks_before(score[j], j, bs, bi)) { bs = score[j]; bi = j; }
  }
  int64_t sel = block_best(bs, bi, warp_s, warp_i, &selected);
  int64_t k = 0;
  while (sel >= 0) {
    if (tid == 0) {
      out_idx[k] = sel;
      out_score[k] = score[sel];
    }
    ++k;
    const Box<T> a = boxes[sel];
    const T aa = area[sel];
    bs = T(0);
    bi = -1;
    for (int64_t j = tid; j < n; j += blockDim.x) {
      if (!alive[j]) continue;
      if (j == sel) { alive[j] = 0; continue; }
      const Box<T> b = boxes[j];
      T s = score[j];
      if (overlap(a.x1, a.x2, b.x1, b.x2) > T(0) && overlap(a.y1, a.y2, b.y1, b.y2) > T(0)) {
        s = mul_rn(s, soft_weight(iou(a, aa, b, area[j]), method, nt, sigma));
        score[j] = s;
        if (s < drop_below) { alive[j] = 0; continue; }
      }
      if (ranks_before(s, j, bs, bi)) { bs = s; bi = j; }
    }
    sel = block_best(bs, bi, warp_s, warp_i, &selected);
  }
  if (tid == 0) *out_count = k;
}

std::tuple<at::Tensor, at::Tensor> soft_nms_cuda(const at::Tensor& boxes, const at::Tensor& scores,
                                                 double iou_threshold, double sigma, double score_threshold,
                                                 int64_t method) {
  check_soft_args(boxes, scores, iou_threshold, sigma, score_threshold, method);
  const c10::cuda::CUDAGuard guard(boxes.device());
  const int64_t n = boxes.size(0);
  const auto opts = boxes.options();
  if (n == 0) return {at::empty({0}, opts.dtype(at::kLong)), at::empty({0}, scores.options())};
  const cudaStream_t stream = current_stream();
  const at::Tensor boxes_c = boxes.contiguous();
  at::Tensor idx = at::empty({n}, opts.dtype(at::kLong));
  at::Tensor count = at::empty({1}, opts.dtype(at::kLong));
  at::Tensor val;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, boxes.scalar_type(), "orbbec_soft_nms_cuda", [&] {
    using T = acc_type<scalar_t>;
    const auto acc_opts = opts.dtype(c10::CppTypeToScalarType<T>::value);
    at::Tensor sorted = at::empty({n, 4}, acc_opts);
    at::Tensor area = at::empty({n}, acc_opts);
    at::Tensor work = at::empty({n}, acc_opts);
    work.copy_(scores);  // a private copy: the kernel decays it in place
    at::Tensor alive = at::empty({n}, opts.dtype(at::kByte));
    val = at::empty({n}, acc_opts);
    Box<T>* sorted_ptr = reinterpret_cast<Box<T>*>(sorted.data_ptr<T>());
    gather_boxes_kernel<scalar_t, T><<<grid_for(n, kGatherThreads), kGatherThreads, 0, stream>>>(
        boxes_c.data_ptr<scalar_t>(), nullptr, n, sorted_ptr, area.data_ptr<T>());
    ORBBEC_LAUNCH_CHECK();
    soft_nms_kernel<T><<<1, kSoftThreads, 0, stream>>>(
        sorted_ptr, area.data_ptr<T>(), work.data_ptr<T>(), alive.data_ptr<uint8_t>(), n, method,
        threshold_below<T>(iou_threshold), static_cast<T>(sigma), threshold_above<T>(score_threshold),
        idx.data_ptr<int64_t>(), val.data_ptr<T>(), count.data_ptr<int64_t>());
    ORBBEC_LAUNCH_CHECK();
  });
  const int64_t kept = count.item<int64_t>();  // the one host sync: the output size
  return {idx.narrow(0, 0, kept), val.narrow(0, 0, kept).to(scores.scalar_type())};
}

}  // namespace
}  // namespace nms
}  // namespace orbbec

TORCH_LIBRARY_IMPL(orbbec, CUDA, m) {
  m.impl("nms", &orbbec::nms::nms_cuda);
  m.impl("batched_nms", &orbbec::nms::batched_nms_cuda);
  m.impl("soft_nms", &orbbec::nms::soft_nms_cuda);
}
