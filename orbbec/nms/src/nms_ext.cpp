// Schemas of the NMS ops and their argument checks. The kernels are registered per device in cpu/
// and cuda/; the fake kernels (data-dependent output size) in orbbec/nms/_ops.py.
#include "nms/src/nms_ext.h"

#include <cmath>

#include <torch/library.h>

namespace orbbec {
namespace nms {

void check_nms_args(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  check_dim(boxes, "boxes", 2);
  ORBBEC_CHECK_VALUE(boxes.size(1) == 4, "orbbec: 'boxes' must have shape [N, 4] (x1, y1, x2, y2), got ",
                     boxes.sizes());
  check_floating(boxes, "boxes");
  check_dim(scores, "scores", 1);
  check_floating(scores, "scores");
  ORBBEC_CHECK_VALUE(scores.size(0) == boxes.size(0), "orbbec: 'scores' must hold one score per box (",
                     boxes.size(0), "), got ", scores.size(0));
  check_same_device(scores, "scores", boxes, "boxes");
  ORBBEC_CHECK_VALUE(!std::isnan(iou_threshold), "orbbec: 'iou_threshold' must not be NaN");
}

void check_batched_args(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
                        double iou_threshold) {
  check_nms_args(boxes, scores, iou_threshold);
  check_dim(idxs, "idxs", 1);
  ORBBEC_CHECK_TYPE(at::isIntegralType(idxs.scalar_type(), /*includeBool=*/false),
                    "orbbec: 'idxs' must be an integer tensor (class ids), got ", idxs.scalar_type());
  ORBBEC_CHECK_VALUE(idxs.size(0) == boxes.size(0), "orbbec: 'idxs' must hold one class id per box (",
                     boxes.size(0), "), got ", idxs.size(0));
  check_same_device(idxs, "idxs", boxes, "boxes");
}

void check_soft_args(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold,
                     double sigma, double score_threshold, int64_t method) {
  check_nms_args(boxes, scores, iou_threshold);
  ORBBEC_CHECK_VALUE(method == kLinear || method == kGaussian,
                     "orbbec: soft_nms 'method' code must be 1 (linear) or 2 (gaussian), got ", method);
  ORBBEC_CHECK_VALUE(sigma > 0 && std::isfinite(sigma), "orbbec: 'sigma' must be a positive number, got ",
                     sigma);
  ORBBEC_CHECK_VALUE(!std::isnan(score_threshold), "orbbec: 'score_threshold' must not be NaN");
}

at::Tensor sort_by_score(const at::Tensor& scores) {
  return std::get<1>(at::sort(scores, /*stable=*/true, /*dim=*/0, /*descending=*/true)).contiguous();
}

ClassOrder class_order(const at::Tensor& scores, const at::Tensor& idxs) {
  ClassOrder o;
  o.by_score = sort_by_score(scores);
  const at::Tensor cls = idxs.to(at::kLong).index_select(0, o.by_score);
  std::tie(o.cls_sorted, o.by_class) = at::sort(cls, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  o.cls_sorted = o.cls_sorted.contiguous();
  o.by_class = o.by_class.contiguous();
  o.order = o.by_score.index_select(0, o.by_class).contiguous();
  return o;
}

}  // namespace nms
}  // namespace orbbec

TORCH_LIBRARY_FRAGMENT(orbbec, m) {
  // Indices of the kept boxes (int64) in decreasing score order. A box is suppressed when its IoU
  // with a kept, higher-ranked box is > iou_threshold. boxes are (x1, y1, x2, y2).
  m.def("nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor");
  // nms within each class of idxs (boxes of different classes never suppress each other).
  m.def("batched_nms(Tensor boxes, Tensor scores, Tensor idxs, float iou_threshold) -> Tensor");
  // Soft-NMS (Bodla et al. 2017): (kept indices in selection order, their decayed scores).
  // method: 1 linear, 2 gaussian.
  m.def("soft_nms(Tensor boxes, Tensor scores, float iou_threshold, float sigma, "
        "float score_threshold, int method) -> (Tensor, Tensor)");
}
