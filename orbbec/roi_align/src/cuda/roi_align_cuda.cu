// CUDA kernels of roi_align.
//
// Forward, NCHW map: one block per (chunk of channels, roi), rois fastest, so that the blocks in
// flight share a few channel planes, which stay in L2. Fixed grids of up to 4x4 samples
// (forward_fixed_kernel): a thread computes the taps of its samples in registers and pools them
// for several channels; the SR sample columns of a bin go to SR lanes (SR = 1, 2, 4), whose
// values meet by shuffles, so that a warp's loads lie along few rows of the map. 3x3 grids, and
// adaptive ones unless the rois sample the map many times over (forward_nchw_kernel): the roi's
// taps are computed once into shared memory; a thread pools one output.
// Forward, channels_last map (or an NCHW one converted, the rest of the time): one block per (roi,
// bin row), its taps in shared memory; threads run along the channels, so each tap is one
// coalesced run of 16-byte loads (8 float16 / 4 float32 channels per thread).
//
// Backward, default: one block per (chunk of 32 channels, roi), rois fastest, scatters with
// atomicAdd into a float32 channels_last buffer, so the atomics of a warp land on consecutive
// addresses (one float4 atomic per thread on sm_90) and the chunk being accumulated stays in L2;
// a tiled transpose then writes an NCHW gradient.
// Backward, deterministic: one block per (image, 8x8 pixel tile, channel chunk) gathers: it lists
// the rois touching its tile in roi order, then their samples in bin order, and each thread sums its
// channel of the tile in shared memory. Every gradient element is written once, by one thread, in an
// order fixed by the inputs: the same bits on every run, and no atomics at all.
//
// A roi with a bad batch index or non-finite coordinates pools zeros and gets no gradient.
#include "roi_align/src/cuda/roi_align_backward_atomic.cuh"
#include "roi_align/src/cuda/roi_align_backward_gather.cuh"
#include "roi_align/src/cuda/roi_align_forward.cuh"

namespace orbbec {
namespace roi_align {
namespace {

at::Tensor roi_align_forward_cuda(const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
                                  int64_t pooled_h, int64_t pooled_w, int64_t sampling_ratio, bool aligned,
                                  int64_t pool_mode) {
  const Params p =
      check_forward_args(input, rois, spatial_scale, pooled_h, pooled_w, sampling_ratio, aligned, pool_mode);
  const c10::cuda::CUDAGuard guard(input.device());
  at::Tensor out = at::empty({rois.size(0), input.size(1), pooled_h, pooled_w},
                             input.options().memory_format(output_format(input)));
  if (out.numel() == 0) return out;
  const at::Tensor rois_c = rois.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "roi_align_forward_cuda", [&] {
    if (pool_mode == kMax) {
      launch_forward<scalar_t, true>(input, rois_c, out, nullptr, p);
    } else {
      launch_forward<scalar_t, false>(input, rois_c, out, nullptr, p);
    }
  });
  return out;
}

at::Tensor roi_align_backward_cuda(const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& input,
                                   double spatial_scale, int64_t pooled_h, int64_t pooled_w, int64_t sampling_ratio,
                                   bool aligned, int64_t pool_mode, bool deterministic) {
  const Params p = check_backward_args(grad, rois, input, spatial_scale, pooled_h, pooled_w, sampling_ratio,
                                       aligned, pool_mode);
  // The atomic kernel indexes a block's (bin, channel) items in 32 bits.
  ORBBEC_CHECK_VALUE(pooled_h * pooled_w < (int64_t(1) << 26), "orbbec: the CUDA backward takes at most 2^26 bins "
                     "per roi, got output_size (", pooled_h, ", ", pooled_w, ")");
  const c10::cuda::CUDAGuard guard(input.device());
  const auto fmt = output_format(input);
  if (grad.numel() == 0 || input.numel() == 0) {
    return at::empty(input.sizes(), input.options().memory_format(fmt)).zero_();  // at::zeros drops the format
  }
  const at::Tensor rois_c = rois.contiguous();
  at::Tensor result;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "roi_align_backward_cuda", [&] {
    if (pool_mode == kMax) {
      // The sample each bin took, recomputed by the forward's own kernel (same ties).
      at::Tensor values = at::empty(grad.sizes(), grad.options().memory_format(at::MemoryFormat::ChannelsLast));
      at::Tensor argmax = at::empty(grad.sizes(), grad.options().dtype(at::kInt).memory_format(at::MemoryFormat::ChannelsLast));
      launch_forward<scalar_t, true>(input, rois_c, values, argmax.data_ptr<int32_t>(), p);
      result = deterministic ? backward_gather<scalar_t, true>(grad, rois_c, argmax, input, fmt, p)
                             : backward_atomic<scalar_t, true>(grad, rois_c, argmax, input, fmt, p);
    } else {
      const at::Tensor none;
      result = deterministic ? backward_gather<scalar_t, false>(grad, rois_c, none, input, fmt, p)
                             : backward_atomic<scalar_t, false>(grad, rois_c, none, input, fmt, p);
    }
  });
  return result;
}

}  // namespace
}  // namespace roi_align
}  // namespace orbbec

TORCH_LIBRARY_IMPL(orbbec, CUDA, m) {
  m.impl("roi_align", &orbbec::roi_align::roi_align_forward_cuda);
  m.impl("roi_align_backward", &orbbec::roi_align::roi_align_backward_cuda);
}
