// CPU kernels of roi_align. The forward runs one roi per task of at::parallel_for; the backward
// splits the channels between tasks, so each gradient element is owned by one task, needs no atomics
// and is summed in the same order on every run. The sampling math is common/roi_align.h, shared
// with the CUDA kernels.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "roi_align/src/roi_align_ext.h"

namespace orbbec {
namespace roi_align {
namespace {

// A bad batch index raises here: the check is free on the CPU, and zeros would hide a bug in the
// caller's roi assembly. (CUDA cannot raise without a device sync; it pools zeros instead.)
template <typename scalar_t>
void check_batch_indices(const at::Tensor& rois, int64_t N) {
  const scalar_t* r = rois.data_ptr<scalar_t>();
  for (int64_t k = 0; k < rois.size(0); ++k) {
    const double b = static_cast<double>(r[k * 5]);
    ORBBEC_CHECK_VALUE(std::isfinite(b) && b >= 0 && b < static_cast<double>(N), "orbbec: box ", k, " of 'boxes'",
                       " has batch index ", b, ", outside [0, ", N, ") (the batch size of 'input')");
  }
}

// A roi's geometry and the taps of all its samples along y ([pooled_h * grid_h]) and x.
template <typename acc_t>
struct RoiTaps {
  RoiGeom<acc_t> g;
  std::vector<AxisTap<acc_t>> y, x;

  template <typename scalar_t>
  void build(const scalar_t* roi, int64_t N, int64_t H, int64_t W, const Params& p) {
    g = make_geom<acc_t>(roi, N, p);
    y.resize(static_cast<size_t>(p.pooled_h * g.grid_h));
    x.resize(static_cast<size_t>(p.pooled_w * g.grid_w));
    for (int64_t ph = 0; ph < p.pooled_h; ++ph)
      for (int iy = 0; iy < g.grid_h; ++iy)
        y[ph * g.grid_h + iy] = axis_tap(sample_coord(g.start_y, g.bin_h, ph, iy, g.grid_h), static_cast<int>(H));
    for (int64_t pw = 0; pw < p.pooled_w; ++pw)
      for (int ix = 0; ix < g.grid_w; ++ix)
        x[pw * g.grid_w + ix] = axis_tap(sample_coord(g.start_x, g.bin_w, pw, ix, g.grid_w), static_cast<int>(W));
  }
};

// argmax, when given, receives the sample index of each max bin, contiguous [K, C, PH, PW].
template <typename scalar_t, bool MAX>
void forward_kernel(const at::Tensor& input, const at::Tensor& rois, at::Tensor& out, int32_t* argmax,
                    const Params& p) {
  using acc_t = acc_type<scalar_t>;
  const int64_t N = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  const int64_t K = rois.size(0), PH = p.pooled_h, PW = p.pooled_w;
  const Strides4 is = strides_of(input), os = strides_of(out);
  const scalar_t* in = input.data_ptr<scalar_t>();
  const scalar_t* rp = rois.data_ptr<scalar_t>();
  scalar_t* op = out.data_ptr<scalar_t>();

  at::parallel_for(0, K, 1, [&](int64_t begin, int64_t end) {
    RoiTaps<acc_t> t;
    for (int64_t k = begin; k < end; ++k) {
      t.build(rp + k * 5, N, H, W, p);
      const RoiGeom<acc_t>& g = t.g;
      for (int64_t c = 0; c < C; ++c) {
        // A roi that pools nothing has grid 0 and never loads; keep the pointer in range anyway.
        const scalar_t* plane = in + (g.batch >= 0 ? g.batch * is.k + c * is.c : 0);
        auto load = [&](int y, int x, acc_t* v) { v[0] = static_cast<acc_t>(plane[y * is.h + x * is.w]); };
        for (int64_t ph = 0; ph < PH; ++ph) {
          const AxisTap<acc_t>* ty = t.y.data() + ph * g.grid_h;
          for (int64_t pw = 0; pw < PW; ++pw) {
            const AxisTap<acc_t>* tx = t.x.data() + pw * g.grid_w;
            acc_t acc[1];
            int32_t arg[1];
            pool_bin<MAX, 1>(
                g.grid_h, g.grid_w, [&](int iy) { return ty[iy]; }, [&](int ix) { return tx[ix]; }, load, acc, arg);
            op[k * os.k + c * os.c + ph * os.h + pw * os.w] = static_cast<scalar_t>(bin_value<MAX>(acc[0], arg[0], g.count));
            if (argmax != nullptr) argmax[((k * C + c) * PH + ph) * PW + pw] = arg[0];
          }
        }
      }
    }
  });
}

// Scatters grad into gin (acc_t, input's shape and strides, zero-filled). In max mode argmax
// (contiguous [K, C, PH, PW]) names the one sample of each bin that receives the gradient.
template <typename scalar_t, bool MAX>
void backward_kernel(const at::Tensor& grad, const at::Tensor& rois, const int32_t* argmax, at::Tensor& gin,
                     const Params& p) {
  using acc_t = acc_type<scalar_t>;
  const int64_t N = gin.size(0), C = gin.size(1), H = gin.size(2), W = gin.size(3);
  const int64_t K = rois.size(0), PH = p.pooled_h, PW = p.pooled_w;
  const Strides4 is = strides_of(gin), gs = strides_of(grad);
  const scalar_t* gp = grad.data_ptr<scalar_t>();
  const scalar_t* rp = rois.data_ptr<scalar_t>();
  acc_t* gi = gin.data_ptr<acc_t>();

  at::parallel_for(0, C, 1, [&](int64_t c_begin, int64_t c_end) {
    RoiTaps<acc_t> t;
    for (int64_t k = 0; k < K; ++k) {
      t.build(rp + k * 5, N, H, W, p);
      const RoiGeom<acc_t>& g = t.g;
      if (g.batch < 0) continue;
      for (int64_t c = c_begin; c < c_end; ++c) {
        acc_t* plane = gi + g.batch * is.k + c * is.c;
        auto scatter = [&](const AxisTap<acc_t>& ty, const AxisTap<acc_t>& tx, acc_t gv) {
          plane[ty.lo * is.h + tx.lo * is.w] += gv * (ty.wlo * tx.wlo);
          plane[ty.lo * is.h + tx.hi * is.w] += gv * (ty.wlo * tx.whi);
          plane[ty.hi * is.h + tx.lo * is.w] += gv * (ty.whi * tx.wlo);
          plane[ty.hi * is.h + tx.hi * is.w] += gv * (ty.whi * tx.whi);
        };
        for (int64_t ph = 0; ph < PH; ++ph) {
          const AxisTap<acc_t>* ty = t.y.data() + ph * g.grid_h;
          for (int64_t pw = 0; pw < PW; ++pw) {
            const AxisTap<acc_t>* tx = t.x.data() + pw * g.grid_w;
            const acc_t gv = static_cast<acc_t>(gp[k * gs.k + c * gs.c + ph * gs.h + pw * gs.w]);
            if (MAX) {
              const int32_t idx = argmax[((k * C + c) * PH + ph) * PW + pw];
              if (idx < 0) continue;
              const AxisTap<acc_t>& sy = ty[idx / g.grid_w];
              const AxisTap<acc_t>& sx = tx[idx % g.grid_w];
              if (sy.lo >= 0 && sx.lo >= 0) scatter(sy, sx, gv);
            } else {
              const acc_t gc = gv / g.count;
              for (int iy = 0; iy < g.grid_h; ++iy) {
                if (ty[iy].lo < 0) continue;
                for (int ix = 0; ix < g.grid_w; ++ix) {
                  if (tx[ix].lo >= 0) scatter(ty[iy], tx[ix], gc);
                }
              }
            }
          }
        }
      }
    }
  });
}

at::Tensor roi_align_forward_cpu(const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
                                 int64_t pooled_h, int64_t pooled_w, int64_t sampling_ratio, bool aligned,
                                 int64_t pool_mode) {
  const Params p =
      check_forward_args(input, rois, spatial_scale, pooled_h, pooled_w, sampling_ratio, aligned, pool_mode);
  const at::Tensor rois_c = rois.contiguous();
  at::Tensor out = at::empty({rois.size(0), input.size(1), pooled_h, pooled_w},
                             input.options().memory_format(output_format(input)));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "roi_align_forward_cpu", [&] {
    check_batch_indices<scalar_t>(rois_c, input.size(0));
    if (out.numel() == 0) return;
    if (pool_mode == kMax) {
      forward_kernel<scalar_t, true>(input, rois_c, out, nullptr, p);
    } else {
      forward_kernel<scalar_t, false>(input, rois_c, out, nullptr, p);
    }
  });
  return out;
}

at::Tensor roi_align_backward_cpu(const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& input,
                                  double spatial_scale, int64_t pooled_h, int64_t pooled_w, int64_t sampling_ratio,
                                  bool aligned, int64_t pool_mode, bool /*deterministic: the CPU always is*/) {
  const Params p = check_backward_args(grad, rois, input, spatial_scale, pooled_h, pooled_w, sampling_ratio,
                                       aligned, pool_mode);
  const at::Tensor rois_c = rois.contiguous();
  const auto fmt = output_format(input);
  at::Tensor result;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "roi_align_backward_cpu", [&] {
    using acc_t = acc_type<scalar_t>;
    check_batch_indices<scalar_t>(rois_c, input.size(0));
    // float16/bfloat16 gradients are summed in float32 and rounded once at the end.
    const auto acc_dtype = c10::CppTypeToScalarType<acc_t>::value;
    // (at::zeros would drop the memory format)
    at::Tensor gin = at::empty(input.sizes(), input.options().dtype(acc_dtype).memory_format(fmt)).zero_();
    if (grad.numel() > 0) {
      if (pool_mode == kMax) {
        at::Tensor values = at::empty(grad.sizes(), grad.options());
        at::Tensor argmax = at::empty(grad.sizes(), grad.options().dtype(at::kInt));
        forward_kernel<scalar_t, true>(input, rois_c, values, argmax.data_ptr<int32_t>(), p);
        backward_kernel<scalar_t, true>(grad, rois_c, argmax.data_ptr<int32_t>(), gin, p);
      } else {
        backward_kernel<scalar_t, false>(grad, rois_c, nullptr, gin, p);
      }
    }
    result = acc_dtype == input.scalar_type() ? gin : gin.to(input.scalar_type());
  });
  return result;
}

}  // namespace
}  // namespace roi_align
}  // namespace orbbec

TORCH_LIBRARY_IMPL(orbbec, CPU, m) {
  m.impl("roi_align", &orbbec::roi_align::roi_align_forward_cpu);
  m.impl("roi_align_backward", &orbbec::roi_align::roi_align_backward_cpu);
}
