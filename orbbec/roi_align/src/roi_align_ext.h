// Argument checks and strides of the roi_align ops, shared by the CPU and CUDA registrations.
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

// The strides of a 4-D tensor ([K, C, H, W] or [N, C, H, W]), as the CPU and CUDA kernels index it.
struct Strides4 {
  int64_t k, c, h, w;
};
inline Strides4 strides_of(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; }

}  // namespace roi_align
}  // namespace orbbec
