// CPU kernels of nms, batched_nms and soft_nms. Boxes are sorted once (stable, so ties keep the
// lower index first, as on the GPU) and copied into structure-of-arrays form so that the inner
// suppression loop is a branch-free loop the compiler vectorizes.
//
// GCC only turns the float selects of the IoU (min, max, the union guard) into vector blends when
// it may assume floating-point operations do not trap; that changes no result, only code shape.
// It must come before every include so that all inline functions share the setting and inline.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <numeric>
#include <tuple>
#include <vector>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "nms/src/nms_ext.h"

namespace orbbec {
namespace nms {
namespace {

template <typename T>
struct BoxArrays {
  std::vector<T> x1, y1, x2, y2, area;
  explicit BoxArrays(int64_t n) : x1(n), y1(n), x2(n), y2(n), area(n) {}
  Box<T> box(int64_t k) const { return Box<T>{x1[k], y1[k], x2[k], y2[k]}; }
};

// Boxes order[0], order[1], ... (or 0, 1, ... when order is null), sanitized, in type T.
template <typename scalar_t, typename T>
BoxArrays<T> gather_boxes(const at::Tensor& boxes, const int64_t* order, int64_t n) {
  const at::Tensor b = boxes.contiguous();
  const scalar_t* p = b.data_ptr<scalar_t>();
  BoxArrays<T> s(n);
  for (int64_t k = 0; k < n; ++k) {
    const scalar_t* q = p + (order ? order[k] : k) * 4;
    Box<T> box{static_cast<T>(q[0]), static_cast<T>(q[1]), static_cast<T>(q[2]), static_cast<T>(q[3])};
    s.area[k] = sanitize(box);
    s.x1[k] = box.x1; s.y1[k] = box.y1; s.x2[k] = box.x2; s.y2[k] = box.y2;
  }
  return s;
}

// Greedy NMS over the sorted positions [begin, end): keep[i] = 1 for kept positions. Only the
// boxes after a kept one are tested against it, so the work is (kept boxes) x N / 2 IoUs.
template <typename T>
void greedy(const BoxArrays<T>& s, int64_t begin, int64_t end, T thr, uint8_t* removed, uint8_t* keep) {
  const T* x1 = s.x1.data(); const T* y1 = s.y1.data();
  const T* x2 = s.x2.data(); const T* y2 = s.y2.data();
  const T* area = s.area.data();
  for (int64_t i = begin; i < end; ++i) {
    keep[i] = removed[i] ? 0 : 1;
    if (removed[i]) continue;
    const Box<T> a = s.box(i);
    const T aa = area[i];
    for (int64_t j = i + 1; j < end; ++j) {
      const Box<T> b{x1[j], y1[j], x2[j], y2[j]};
      removed[j] |= static_cast<uint8_t>(iou(a, aa, b, area[j]) > thr);
    }
  }
}

// order[k] for every k with flag[k], in k order.
at::Tensor select_flagged(const at::Tensor& order, const std::vector<uint8_t>& flag) {
  const int64_t count = std::accumulate(flag.begin(), flag.end(), int64_t(0));
  at::Tensor out = at::empty({count}, order.options());
  const int64_t* src = order.data_ptr<int64_t>();
  int64_t* dst = out.data_ptr<int64_t>();
  for (size_t k = 0; k < flag.size(); ++k) {
    if (flag[k]) *dst++ = src[k];
  }
  return out;
}

at::Tensor nms_cpu(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  check_nms_args(boxes, scores, iou_threshold);
  const int64_t n = boxes.size(0);
  if (n == 0) return at::empty({0}, boxes.options().dtype(at::kLong));
  const at::Tensor order = sort_by_score(scores);
  std::vector<uint8_t> removed(n, 0), keep(n, 0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, boxes.scalar_type(), "orbbec_nms_cpu", [&] {
    using T = acc_type<scalar_t>;
    const auto s = gather_boxes<scalar_t, T>(boxes, order.data_ptr<int64_t>(), n);
    greedy(s, 0, n, threshold_below<T>(iou_threshold), removed.data(), keep.data());
  });
  return select_flagged(order, keep);
}

// Sorted by (class, score): every class is a contiguous run, processed on its own (in parallel).
// The kept flags are then put back in plain score order, which is the output order.
at::Tensor batched_nms_cpu(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
                           double iou_threshold) {
  check_batched_args(boxes, scores, idxs, iou_threshold);
  const int64_t n = boxes.size(0);
  if (n == 0) return at::empty({0}, boxes.options().dtype(at::kLong));
  const ClassOrder co = class_order(scores, idxs);
  const at::Tensor &by_score = co.by_score, &cls_sorted = co.cls_sorted, &by_class = co.by_class, &order = co.order;

  const int64_t* c = cls_sorted.data_ptr<int64_t>();
  std::vector<int64_t> starts;  // first position of each class run, then n
  for (int64_t k = 0; k < n; ++k) {
    if (k == 0 || c[k] != c[k - 1]) starts.push_back(k);
  }
  starts.push_back(n);
  const int64_t runs = static_cast<int64_t>(starts.size()) - 1;

  std::vector<uint8_t> removed(n, 0), keep(n, 0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, boxes.scalar_type(), "orbbec_batched_nms_cpu", [&] {
    using T = acc_type<scalar_t>;
    const auto s = gather_boxes<scalar_t, T>(boxes, order.data_ptr<int64_t>(), n);
    const T thr = threshold_below<T>(iou_threshold);
    at::parallel_for(0, runs, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) greedy(s, starts[r], starts[r + 1], thr, removed.data(), keep.data());
    });
  });
  std::vector<uint8_t> keep_by_score(n, 0);
  const int64_t* pos = by_class.data_ptr<int64_t>();
  for (int64_t k = 0; k < n; ++k) keep_by_score[pos[k]] = keep[k];
  return select_flagged(by_score, keep_by_score);
}

// Soft-NMS as in the reference code of Bodla et al. 2017: select the highest-ranked remaining box;
// every remaining box whose intersection with it is not empty has its score multiplied by the
// decay weight and is dropped when the new score is below score_threshold. One pass per selected
// box does the decay and finds the next selection.
template <typename scalar_t, typename T>
std::tuple<at::Tensor, at::Tensor> soft_nms_impl(const at::Tensor& boxes, const at::Tensor& scores,
                                                 double iou_threshold, double sigma,
                                                 double score_threshold, int64_t method) {
  const int64_t n = boxes.size(0);
  const auto s = gather_boxes<scalar_t, T>(boxes, nullptr, n);
  const at::Tensor sc_in = scores.to(c10::CppTypeToScalarType<T>::value).contiguous();
  std::vector<T> sc(sc_in.data_ptr<T>(), sc_in.data_ptr<T>() + n);
  const T nt = threshold_below<T>(iou_threshold);
  const T drop_below = threshold_above<T>(score_threshold);
  const T sig = static_cast<T>(sigma);

  std::vector<int64_t> alive(n);  // remaining boxes, in no particular order (the ranking breaks ties)
  std::iota(alive.begin(), alive.end(), int64_t(0));
  std::vector<int64_t> out_idx;
  std::vector<T> out_score;
  int64_t best = -1;
  size_t best_pos = 0;
  for (size_t p = 0; p < alive.size(); ++p) {
    if (ranks_before(sc[alive[p]], alive[p], best < 0 ? T(0) : sc[best], best)) {
      best = alive[p];
      best_pos = p;
    }
  }
  while (best >= 0) {
    const int64_t sel = best;
    out_idx.push_back(sel);
    out_score.push_back(sc[sel]);
    alive[best_pos] = alive.back();
    alive.pop_back();
    const Box<T> a = s.box(sel);
    const T aa = s.area[sel];
    best = -1;
    for (size_t p = 0; p < alive.size();) {
      const int64_t j = alive[p];
      const Box<T> b = s.box(j);
      if (overlap(a.x1, a.x2, b.x1, b.x2) > T(0) && overlap(a.y1, a.y2, b.y1, b.y2) > T(0)) {
        sc[j] = mul_rn(sc[j], soft_weight(iou(a, aa, b, s.area[j]), method, nt, sig));
        if (sc[j] < drop_below) {  // swap-remove; the moved box is visited next
          alive[p] = alive.back();
          alive.pop_back();
          continue;
        }
      }
      if (ranks_before(sc[j], j, best < 0 ? T(0) : sc[best], best)) {
        best = j;
        best_pos = p;
      }
      ++p;
    }
  }
  const int64_t k = static_cast<int64_t>(out_idx.size());
  at::Tensor idx = at::empty({k}, boxes.options().dtype(at::kLong));
  at::Tensor val = at::empty({k}, boxes.options().dtype(c10::CppTypeToScalarType<T>::value));
  std::copy(out_idx.begin(), out_idx.end(), idx.data_ptr<int64_t>());
  std::copy(out_score.begin(), out_score.end(), val.data_ptr<T>());
  return {idx, val.to(scores.scalar_type())};
}

std::tuple<at::Tensor, at::Tensor> soft_nms_cpu(const at::Tensor& boxes, const at::Tensor& scores,
                                                double iou_threshold, double sigma,
                                                double score_threshold, int64_t method) {
  check_soft_args(boxes, scores, iou_threshold, sigma, score_threshold, method);
  std::tuple<at::Tensor, at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, boxes.scalar_type(), "orbbec_soft_nms_cpu", [&] {
    using T = acc_type<scalar_t>;
    out = soft_nms_impl<scalar_t, T>(boxes, scores, iou_threshold, sigma, score_threshold, method);
  });
  return out;
}

}  // namespace
}  // namespace nms
}  // namespace orbbec

TORCH_LIBRARY_IMPL(orbbec, CPU, m) {
  m.impl("nms", &orbbec::nms::nms_cpu);
  m.impl("batched_nms", &orbbec::nms::batched_nms_cpu);
  m.impl("soft_nms", &orbbec::nms::soft_nms_cpu);
}
