// The single-launch path of the CUDA nms and batched_nms for a few hundred boxes (nms_small_cuda.cu).
#pragma once
#include <torch/types.h>

namespace orbbec {
namespace nms {

// True when small_nms_cuda takes these arguments: scores of the boxes' dtype and at most 512 boxes
// (256 for float64). Arguments are checked already.
bool small_nms_applies(const at::Tensor& boxes, const at::Tensor& scores);

// Indices of the kept boxes in decreasing score order; with idxs defined (class ids), boxes of
// different classes never suppress each other (batched_nms). Reads the kept count back.
at::Tensor small_nms_cuda(const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
                          double iou_threshold);

}  // namespace nms
}  // namespace orbbec
