// Argument checks of the roi_align ops, shared by the CPU and CUDA registrations.
#pragma once
#include <torch/types.h>

#include "common/src/checks.h"
#include "common/src/layout.h"
#include "roi_align/src/common/roi_align.h"

namespace orbbec {
namespace roi_align {

// Checks input [N,C,H,W] (float16/bfloat16/float32/float64), rois [K,5] of input's dtype and
// device, the output size, sampling_ratio and pool_mode; returns the kernels' parameters.
Params check_forward_args(const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
                          int64_t pooled_h, int64_t pooled_w, int64_t sampling_ratio, bool aligned,
                          int64_t pool_mode);

// The forward checks plus grad [K,C,pooled_h,pooled_w] of input's dtype and device.
Params check_backward_args(const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& input,
                           double spatial_scale, int64_t pooled_h, int64_t pooled_w,
                           int64_t sampling_ratio, bool aligned, int64_t pool_mode);

}  // namespace roi_align
}  // namespace orbbec
