// Schemas of the roi_align ops and their argument checks. The kernels are registered per device in
// cpu/ and cuda/; fake kernels and autograd are registered from Python (orbbec/roi_align/_ops.py).
#include "roi_align/src/roi_align_ext.h"

#include <cmath>
#include <limits>

#include <torch/library.h>

namespace orbbec {
namespace roi_align {

Params check_forward_args(const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
                          int64_t pooled_h, int64_t pooled_w, int64_t sampling_ratio, bool aligned,
                          int64_t pool_mode) {
  check_dim(input, "input", 4);
  const auto st = input.scalar_type();
  ORBBEC_CHECK_TYPE(st == at::kHalf || st == at::kBFloat16 || st == at::kFloat || st == at::kDouble,
                    "orbbec: 'input' must be float16, bfloat16, float32 or float64, got ", st);
  check_dim(rois, "boxes", 2);
  ORBBEC_CHECK_VALUE(rois.size(1) == 5, "orbbec: 'boxes' must have shape [K, 5] (batch index, x1, y1, x2, y2), got ",
                     rois.sizes());
  ORBBEC_CHECK_TYPE(rois.scalar_type() == st, "orbbec: 'boxes' must have the dtype of 'input' (", st, "), got ",
                    rois.scalar_type());
  check_same_device(rois, "boxes", input, "input");
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  ORBBEC_CHECK_VALUE(input.size(2) > 0 && input.size(3) > 0 && input.size(2) < kIntMax && input.size(3) < kIntMax,
                     "orbbec: 'input' must have a height and width in [1, 2^31 - 1), got shape ", input.sizes());
  ORBBEC_CHECK_VALUE(rois.size(0) < kIntMax && input.size(0) < kIntMax,
                     "orbbec: at most 2^31 - 1 boxes and images, got ", rois.size(0), " and ", input.size(0));
  ORBBEC_CHECK_VALUE(pooled_h > 0 && pooled_w > 0 && pooled_h < kIntMax && pooled_w < kIntMax,
                     "orbbec: 'output_size' must be positive (and below 2^31), got (", pooled_h, ", ", pooled_w, ")");
  ORBBEC_CHECK_VALUE(sampling_ratio <= kMaxGrid, "orbbec: 'sampling_ratio' must be at most ", kMaxGrid, ", got ",
                     sampling_ratio);
  ORBBEC_CHECK_VALUE(std::isfinite(spatial_scale), "orbbec: 'spatial_scale' must be finite, got ", spatial_scale);
  ORBBEC_CHECK_VALUE(pool_mode == kAvg || pool_mode == kMax,
                     "orbbec: 'pool_mode' code must be 0 (avg) or 1 (max), got ", pool_mode);
  return Params{spatial_scale, pooled_h, pooled_w, sampling_ratio, aligned};
}

Params check_backward_args(const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& input,
                           double spatial_scale, int64_t pooled_h, int64_t pooled_w,
                           int64_t sampling_ratio, bool aligned, int64_t pool_mode) {
  const Params p = check_forward_args(input, rois, spatial_scale, pooled_h, pooled_w, sampling_ratio,
                                      aligned, pool_mode);
  check_dim(grad, "grad", 4);
  ORBBEC_CHECK_VALUE(grad.size(0) == rois.size(0) && grad.size(1) == input.size(1) && grad.size(2) == pooled_h &&
                         grad.size(3) == pooled_w,
                     "orbbec: 'grad' must have shape [K, C, pooled_h, pooled_w] = [", rois.size(0), ", ",
                     input.size(1), ", ", pooled_h, ", ", pooled_w, "], got ", grad.sizes());
  ORBBEC_CHECK_TYPE(grad.scalar_type() == input.scalar_type(), "orbbec: 'grad' must have the dtype of 'input' (",
                    input.scalar_type(), "), got ", grad.scalar_type());
  check_same_device(grad, "grad", input, "input");
  return p;
}

}  // namespace roi_align
}  // namespace orbbec

TORCH_LIBRARY_FRAGMENT(orbbec, m) {
  // Argument names are the Python API's (orbbec.roi_align.roi_align). boxes [K, 5]: (batch index, x1,
  // y1, x2, y2) in image coordinates; output [K, C, pooled_height,
  // pooled_width] in the memory format of input. pool_mode: 0 average, 1 max.
  m.def("roi_align(Tensor input, Tensor boxes, float spatial_scale, int pooled_height, int pooled_width, "
        "int sampling_ratio, bool aligned, int pool_mode) -> Tensor");
  // Gradient of roi_align with respect to input (input gives the shape and memory format, and the
  // values in max mode). deterministic: no floating-point atomics on CUDA, same bits every run.
  m.def("roi_align_backward(Tensor grad, Tensor boxes, Tensor input, float spatial_scale, int pooled_height, "
        "int pooled_width, int sampling_ratio, bool aligned, int pool_mode, bool deterministic) -> Tensor");
}
