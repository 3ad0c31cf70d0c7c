// Schemas of the warp_affine ops and their argument checks. The kernels are registered per device
// in cpu/ and cuda/; fake kernels and autograd are registered from Python (orbbec/warpaffine/_ops.py).
#include "warpaffine/src/warpaffine_ext.h"

#include <torch/library.h>

namespace orbbec {
namespace warpaffine {

BorderValues check_forward_args(const at::Tensor& src, const at::Tensor& inv_matrix, int64_t out_h,
                                int64_t out_w, int64_t interpolation, int64_t border_mode,
                                at::ArrayRef<double> border_value) {
  check_dim(src, "src", 4);
  const auto st = src.scalar_type();
  ORBBEC_CHECK_TYPE(st == at::kByte || st == at::kHalf || st == at::kBFloat16 || st == at::kFloat ||
                        st == at::kDouble,
                    "orbbec: 'src' must be uint8, float16, bfloat16, float32 or float64, got ", st);
  check_dim(inv_matrix, "M", 3);
  ORBBEC_CHECK_VALUE(inv_matrix.size(1) == 2 && inv_matrix.size(2) == 3 &&
                         inv_matrix.size(0) == src.size(0),
                     "orbbec: 'M' must have shape [B, 2, 3] with B = ", src.size(0),
                     " (the batch of 'src'), got ", inv_matrix.sizes());
  ORBBEC_CHECK_TYPE(inv_matrix.scalar_type() == at::kFloat || inv_matrix.scalar_type() == at::kDouble,
                    "orbbec: 'M' must be float32 or float64, got ", inv_matrix.scalar_type());
  check_same_device(inv_matrix, "M", src, "src");
  ORBBEC_CHECK_VALUE(out_h > 0 && out_w > 0, "orbbec: output size must be positive, got out_h=", out_h,
                     ", out_w=", out_w);
  ORBBEC_CHECK_VALUE(src.size(0) == 0 || (src.size(2) > 0 && src.size(3) > 0),
                     "orbbec: 'src' must have a non-empty height and width, got shape ", src.sizes());
  ORBBEC_CHECK_VALUE(src.size(1) > 0, "orbbec: 'src' must have at least one channel, got shape ",
                     src.sizes());
  ORBBEC_CHECK_VALUE(interpolation >= kNearest && interpolation <= kBicubic,
                     "orbbec: 'interpolation' code must be 0 (nearest), 1 (bilinear) or 2 (bicubic), got ",
                     interpolation);
  ORBBEC_CHECK_VALUE(border_mode == kConstant || border_mode == kReplicate || border_mode == kReflect ||
                         border_mode == kWrap || border_mode == kReflect101,
                     "orbbec: 'border_mode' code must be a cv2.BORDER_* value in [0, 4], got ", border_mode);
  const int64_t C = src.size(1);
  ORBBEC_CHECK_VALUE(border_value.size() == 1 || int64_t(border_value.size()) == C,
                     "orbbec: 'border_value' must hold 1 value or one per channel (", C, "), got ",
                     border_value.size());
  ORBBEC_CHECK_VALUE(border_value.size() <= size_t(kMaxBorderChannels),
                     "orbbec: per-channel 'border_value' is supported up to ", kMaxBorderChannels,
                     " channels, got ", border_value.size());
  BorderValues bv{};
  bv.count = static_cast<int>(border_value.size());
  for (size_t i = 0; i < border_value.size(); ++i) bv.v[i] = border_value[i];
  return bv;
}

BorderValues check_backward_args(const at::Tensor& grad_out, const at::Tensor& src,
                                 const at::Tensor& inv_matrix, int64_t interpolation, int64_t border_mode,
                                 at::ArrayRef<double> border_value) {
  check_dim(grad_out, "grad_out", 4);
  const BorderValues bv = check_forward_args(src, inv_matrix, grad_out.size(2), grad_out.size(3),
                                             interpolation, border_mode, border_value);
  check_floating(src, "src");
  ORBBEC_CHECK_VALUE(grad_out.size(0) == src.size(0) && grad_out.size(1) == src.size(1),
                     "orbbec: 'grad_out' must have the batch and channels of 'src', got ",
                     grad_out.sizes(), " and ", src.sizes());
  ORBBEC_CHECK_TYPE(grad_out.scalar_type() == src.scalar_type(),
                    "orbbec: 'grad_out' must have the dtype of 'src'");
  check_same_device(grad_out, "grad_out", src, "src");
  return bv;
}

OutputTransform check_output_args(int64_t channels, at::ScalarType out_dtype, at::ArrayRef<double> mean,
                                  at::ArrayRef<double> std, double scale, bool reverse_channels) {
  ORBBEC_CHECK_TYPE(out_dtype == at::kFloat || out_dtype == at::kHalf || out_dtype == at::kBFloat16 ||
                        out_dtype == at::kByte,
                    "orbbec: 'out_dtype' must be float32, float16, bfloat16 or uint8, got ", out_dtype);
  ORBBEC_CHECK_VALUE(channels <= kMaxBorderChannels, "orbbec: the fused output supports up to ",
                     kMaxBorderChannels, " channels, got ", channels);
  auto expand = [&](at::ArrayRef<double> v, const char* name, double fallback, float* dst) {
    ORBBEC_CHECK_VALUE(v.size() <= 1 || int64_t(v.size()) == channels, "orbbec: '", name,
                       "' must hold 1 value or one per channel (", channels, "), got ", v.size());
    for (int64_t c = 0; c < channels; ++c) {
      dst[c] = static_cast<float>(v.empty() ? fallback : v[v.size() == 1 ? 0 : c]);
    }
  };
  OutputTransform ot{};
  ot.reverse_channels = reverse_channels;
  ot.scale = static_cast<float>(scale);
  ot.normalize = !mean.empty() || !std.empty() || scale != 1.0;
  expand(mean, "mean", 0.0, ot.mean);
  expand(std, "std", 1.0, ot.std);
  for (int64_t c = 0; c < channels; ++c) {
    ORBBEC_CHECK_VALUE(ot.std[c] != 0.0f, "orbbec: 'std' must be non-zero, got 0 for channel ", c);
  }
  return ot;
}

BorderValues check_list_args(at::TensorList images, const at::Tensor& inv_matrix, int64_t out_h, int64_t out_w,
                             int64_t interpolation, int64_t border_mode, at::ArrayRef<double> border_value) {
  ORBBEC_CHECK_VALUE(!images.empty(), "orbbec: 'src' must hold at least one image");
  const at::Tensor& first = images[0];
  for (size_t i = 0; i < images.size(); ++i) {
    const at::Tensor& im = images[i];
    ORBBEC_CHECK_VALUE(im.dim() == 3, "orbbec: 'src[", i, "]' must be an HWC image (3-D), got shape ",
                       im.sizes());
    ORBBEC_CHECK_VALUE(im.size(2) == first.size(2), "orbbec: 'src[", i, "]' has ", im.size(2),
                       " channels, 'src[0]' has ", first.size(2));
    ORBBEC_CHECK_TYPE(im.scalar_type() == first.scalar_type(), "orbbec: 'src[", i, "]' is ", im.scalar_type(),
                      ", 'src[0]' is ", first.scalar_type());
    ORBBEC_CHECK_VALUE(im.device() == first.device(), "orbbec: 'src[", i, "]' is on ", im.device(),
                       ", 'src[0]' on ", first.device());
    ORBBEC_CHECK_VALUE(im.size(0) > 0 && im.size(1) > 0 && im.size(2) > 0,
                       "orbbec: 'src[", i, "]' must not be empty, got shape ", im.sizes());
  }
  // The rest is checked as for a batch: one HWC image viewed as [1, C, H, W].
  ORBBEC_CHECK_VALUE(inv_matrix.dim() == 3 && inv_matrix.size(0) == int64_t(images.size()),
                     "orbbec: 'M' must have shape [B, 2, 3] with B = ", images.size(),
                     " (one per image), got ", inv_matrix.sizes());
  return check_forward_args(first.permute({2, 0, 1}).unsqueeze(0), inv_matrix.narrow(0, 0, 1), out_h, out_w,
                            interpolation, border_mode, border_value);
}

at::Tensor make_fused_output(int64_t B, int64_t C, int64_t out_h, int64_t out_w, at::ScalarType dtype,
                             bool channels_last, const at::Device& device) {
  return at::empty({B, C, out_h, out_w}, at::TensorOptions().dtype(dtype).device(device).memory_format(
                                             channels_last ? at::MemoryFormat::ChannelsLast
                                                           : at::MemoryFormat::Contiguous));
}

void check_invert_args(const at::Tensor& matrix) {
  ORBBEC_CHECK_VALUE(matrix.dim() == 3 && matrix.size(1) == 2 && matrix.size(2) == 3,
                     "orbbec: 'M' must have shape [N, 2, 3], got ", matrix.sizes());
  ORBBEC_CHECK_TYPE(matrix.scalar_type() == at::kDouble, "orbbec: 'M' must be float64, got ",
                    matrix.scalar_type());
}

}  // namespace warpaffine
}  // namespace orbbec

TORCH_LIBRARY_FRAGMENT(orbbec, m) {
  // Argument names are the Python API's (orbbec.warpaffine.warp_affine). M is the inverse map: it
  // maps each output pixel to the input position it samples (inverse_map=True,
  // cv2.WARP_INVERSE_MAP), unless invert_matrix, where M maps source to destination and the op
  // inverts it (in float64, with invert_affine's arithmetic) on its way to the kernels: no separate
  // inversion, conversion or copy launch per call. border_mode and interpolation are cv2's integer codes.
  m.def("warp_affine(Tensor src, Tensor M, int out_h, int out_w, int interpolation, "
        "int border_mode, float[] border_value, bool invert_matrix=False) -> Tensor");
  // warp_affine, then out = (v * scale - mean) / std per channel (channels optionally reversed),
  // written as out_dtype in NCHW or NHWC, in one pass. No autograd.
  m.def("warp_affine_fused(Tensor src, Tensor M, int out_h, int out_w, int interpolation, "
        "int border_mode, float[] border_value, ScalarType out_dtype, float[] mean, float[] std, float scale, "
        "bool reverse_channels, bool channels_last_out, bool invert_matrix=False) -> Tensor");
  // The same for a list of HWC images of different sizes (as decoders return them), one launch.
  m.def("warp_affine_list(Tensor[] src, Tensor M, int out_h, int out_w, int interpolation, "
        "int border_mode, float[] border_value, ScalarType out_dtype, float[] mean, float[] std, float scale, "
        "bool reverse_channels, bool channels_last_out, bool invert_matrix=False) -> Tensor");
  // Inverse of float64 affine matrices [N, 2, 3] in one launch (cv2.invertAffineTransform); no autograd.
  m.def("invert_affine(Tensor M) -> Tensor");
  // Gradients of warp_affine with respect to src and M (zeros where not needed).
  m.def("warp_affine_backward(Tensor grad_out, Tensor src, Tensor M, int interpolation, "
        "int border_mode, float[] border_value, bool need_src_grad, bool need_matrix_grad) -> (Tensor, Tensor)");
}
