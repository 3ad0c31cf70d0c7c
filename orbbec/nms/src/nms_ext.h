// Argument checks of the NMS ops, shared by the CPU and CUDA registrations.
#pragma once
#include <torch/types.h>

#include "common/src/checks.h"
#include "nms/src/common/nms.h"

namespace orbbec {
namespace nms {

// boxes [N, 4] floating point, scores [N] floating point on boxes' device, threshold not NaN.
void check_nms_args(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold);

// As check_nms_args, plus idxs [N] of an integer type on boxes' device.
void check_batched_args(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
                        double iou_threshold);

// As check_nms_args, plus sigma > 0, score_threshold not NaN and a known method code.
void check_soft_args(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold,
                     double sigma, double score_threshold, int64_t method);

// Indices of scores in decreasing order, ties by index (a stable sort): the rank order of every op.
at::Tensor sort_by_score(const at::Tensor& scores);

// batched_nms's order, the same on every device: boxes by score, then regrouped by class (stable, so
// each class stays in score order).
struct ClassOrder {
  at::Tensor by_score;    // [N] box index of the k-th box by score
  at::Tensor cls_sorted;  // [N] class of the k-th box by (class, score)
  at::Tensor by_class;    // [N] position in by_score of the k-th box by (class, score)
  at::Tensor order;       // [N] box index of the k-th box by (class, score)
};
ClassOrder class_order(const at::Tensor& scores, const at::Tensor& idxs);

}  // namespace nms
}  // namespace orbbec
