// Argument checks of the warp_affine ops, shared by the CPU and CUDA registrations.
#pragma once
#include <vector>

#include <torch/types.h>

#include "common/src/checks.h"
#include "common/src/layout.h"
#include "warpaffine/src/common/warpaffine.h"

namespace orbbec {
namespace warpaffine {

// Checks src [B,C,H,W] (any strides), inv_matrix [B,2,3] float32/float64 on src's device, the
// output size, the modes and the border values; returns the border values for the kernels.
BorderValues check_forward_args(const at::Tensor& src, const at::Tensor& inv_matrix, int64_t out_h,
                                int64_t out_w, int64_t interpolation, int64_t border_mode,
                                at::ArrayRef<double> border_value);

BorderValues check_backward_args(const at::Tensor& grad_out, const at::Tensor& src,
                                 const at::Tensor& inv_matrix, int64_t interpolation, int64_t border_mode,
                                 at::ArrayRef<double> border_value);

// Checks the fused output arguments (dtype float32/float16/bfloat16/uint8; mean and std with 0, 1 or
// C values, std non-zero) and returns them as the kernels take them.
OutputTransform check_output_args(int64_t channels, at::ScalarType out_dtype, at::ArrayRef<double> mean,
                                  at::ArrayRef<double> std, double scale, bool reverse_channels);

// Checks a list of HWC images (same channels, dtype and device; non-empty) and the rest as
// check_forward_args does.
BorderValues check_list_args(at::TensorList images, const at::Tensor& inv_matrix, int64_t out_h, int64_t out_w,
                             int64_t interpolation, int64_t border_mode, at::ArrayRef<double> border_value);

at::Tensor make_fused_output(int64_t B, int64_t C, int64_t out_h, int64_t out_w, at::ScalarType dtype,
                             bool channels_last, const at::Device& device);

// invert_affine's argument checks: matrix is float64 [N, 2, 3].
void check_invert_args(const at::Tensor& matrix);

}  // namespace warpaffine
}  // namespace orbbec
