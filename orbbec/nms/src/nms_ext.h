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

}  // namespace nms
}  // namespace orbbec
