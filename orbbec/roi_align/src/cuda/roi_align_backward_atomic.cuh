// Backward of roi_align with atomics, the default (see roi_align_cuda.cu).
#pragma once
#include "roi_align/src/cuda/roi_align_forward.cuh"

namespace orbbec {
namespace roi_align {
namespace {  // one translation unit (roi_align_cuda.cu) includes these headers

template <typename acc_t, int VEC>
__device__ __forceinline__ void atomic_add_vec(acc_t* dst, const acc_t* v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (std::is_same<acc_t, float>::value && VEC == 4) {
    atomicAdd(reinterpret_cast<float4*>(dst), make_float4(v[0], v[1], v[2], v[3]));
  } else
#endif
  {
#pragma unroll
    for (int i = 0; i < VEC; ++i) atomicAdd(dst + i, v[i]);
  }
}

// gbuf: zeroed [N, H, W, C] accumulator; VEC channels per thread (C % VEC == 0). One block per
// (chunk of kChunkC channels, roi), rois fastest: the blocks in flight add into one chunk of every
// pixel (one 128-byte float line each, about 16 MB for a 2 x 200 x 304 map), which stays in L2
// instead of going back and forth to DRAM. Threads cover (bin, channel group), groups fastest, so
// a warp's atomics of a tap fill whole lines of a few pixels.
template <typename scalar_t, int VEC, bool MAX>
__global__ void __launch_bounds__(kMaxThreads)
    backward_atomic_kernel(const scalar_t* __restrict__ grad, Strides4 gs, const int32_t* __restrict__ argmax,
                           Strides4 as, const scalar_t* __restrict__ rois, acc_type<scalar_t>* __restrict__ gbuf,
                           int64_t K, int64_t N, int64_t C, int H, int W, Params p, int cap) {
  using acc_t = acc_type<scalar_t>;
  extern __shared__ __align__(16) unsigned char roi_smem[];
  AxisTap<acc_t>* const tab = reinterpret_cast<AxisTap<acc_t>*>(roi_smem);
  const int PW = static_cast<int>(p.pooled_w), bins = static_cast<int>(p.pooled_h * p.pooled_w);
  const int64_t chunks = (C + kChunkC - 1) / kChunkC;
  for (int64_t blk = blockIdx.x; blk < chunks * K; blk += gridDim.x) {
    const int64_t chunk = blk / K, k = blk - chunk * K;
    RoiGeom<acc_t> g;
    const bool tabled = prepare_roi(rois, k, N, H, W, 1, p, cap, g, tab);
    if (g.batch < 0) continue;  // uniform over the block
    const AxisTap<acc_t>* const xtab = tab + p.pooled_h * g.grid_h;
    const int64_t c_begin = chunk * kChunkC;
    const int groups = static_cast<int>(std::min<int64_t>(kChunkC, C - c_begin)) / VEC;
    acc_t* img = gbuf + g.batch * H * W * C;
    for (int item = threadIdx.x; item < bins * groups; item += blockDim.x) {
      const int bin = item / groups, ph = bin / PW, pw = bin - ph * PW;
      const int64_t c0 = c_begin + (item - bin * groups) * VEC;
      auto tap_y = [&](int iy) {
        return tabled ? tab[ph * g.grid_h + iy] : axis_tap(sample_coord(g.start_y, g.bin_h, ph, iy, g.grid_h), H);
      };
      auto tap_x = [&](int ix) {
        return tabled ? xtab[pw * g.grid_w + ix] : axis_tap(sample_coord(g.start_x, g.bin_w, pw, ix, g.grid_w), W);
      };
      auto pixel = [&](int y, int x) { return img + (static_cast<int64_t>(y) * W + x) * C + c0; };
      acc_t gv[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) gv[i] = static_cast<acc_t>(grad[k * gs.k + (c0 + i) * gs.c + ph * gs.h + pw * gs.w]);
      if constexpr (MAX) {
        for (int i = 0; i < VEC; ++i) {
          const int32_t idx = argmax[k * as.k + (c0 + i) * as.c + ph * as.h + pw * as.w];
          if (idx < 0) continue;
          const AxisTap<acc_t> ty = tap_y(idx / g.grid_w), tx = tap_x(idx % g.grid_w);
          if (ty.lo < 0 || tx.lo < 0) continue;
          atomicAdd(pixel(ty.lo, tx.lo) + i, gv[i] * (ty.wlo * tx.wlo));
          atomicAdd(pixel(ty.lo, tx.hi) + i, gv[i] * (ty.wlo * tx.whi));
          atomicAdd(pixel(ty.hi, tx.lo) + i, gv[i] * (ty.whi * tx.wlo));
          atomicAdd(pixel(ty.hi, tx.hi) + i, gv[i] * (ty.whi * tx.whi));
        }
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) gv[i] = gv[i] / g.count;
        for (int iy = 0; iy < g.grid_h; ++iy) {
          const AxisTap<acc_t> ty = tap_y(iy);
          if (ty.lo < 0) continue;
          for (int ix = 0; ix < g.grid_w; ++ix) {
            const AxisTap<acc_t> tx = tap_x(ix);
            if (tx.lo < 0) continue;
            const acc_t w[4] = {ty.wlo * tx.wlo, ty.wlo * tx.whi, ty.whi * tx.wlo, ty.whi * tx.whi};
            acc_t* dst[4] = {pixel(ty.lo, tx.lo), pixel(ty.lo, tx.hi), pixel(ty.hi, tx.lo), pixel(ty.hi, tx.hi)};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              acc_t v[VEC];
#pragma unroll
              for (int i = 0; i < VEC; ++i) v[i] = gv[i] * w[j];
              atomic_add_vec<acc_t, VEC>(dst[j], v);
            }
          }
        }
      }
    }
  }
}

// out[n, c, p] = in[n, p, c] (p over H * W pixels): the [N, H, W, C] accumulator to a contiguous
// NCHW gradient, through 32 x 32 shared tiles so that both the reads (along c) and the writes
// (along p) coalesce, which a strided copy_ of the permuted view does not. Blocks of 32 x 8.
template <typename acc_t, typename scalar_t>
__global__ void nhwc_to_nchw_kernel(const acc_t* __restrict__ in, scalar_t* __restrict__ out, int64_t N, int64_t C,
                                    int64_t P) {
  __shared__ acc_t tile[32][33];  // padded: the column reads of the write phase miss bank conflicts
  const int64_t tiles_c = (C + 31) / 32, tiles_p = (P + 31) / 32;
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t blk = blockIdx.x; blk < N * tiles_c * tiles_p; blk += gridDim.x) {
    const int64_t tp = blk % tiles_p, rest = blk / tiles_p, tc = rest % tiles_c, n = rest / tiles_c;
    const int64_t p0 = tp * 32, c0 = tc * 32;
    for (int j = ty; j < 32; j += 8) {
      const int64_t pix = p0 + j, c = c0 + tx;
      if (pix < P && c < C) tile[j][tx] = in[(n * P + pix) * C + c];
    }
    __syncthreads();
    for (int j = ty; j < 32; j += 8) {
      const int64_t c = c0 + j, pix = p0 + tx;
      if (pix < P && c < C) out[(n * C + c) * P + pix] = static_cast<scalar_t>(tile[tx][j]);
    }
    __syncthreads();  // the tile is refilled next
  }
}

template <typename scalar_t, bool MAX>
at::Tensor backward_atomic(const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& argmax,
                           const at::Tensor& input, at::MemoryFormat fmt, const Params& p) {
  using acc_t = acc_type<scalar_t>;
  const auto acc_dtype = c10::CppTypeToScalarType<acc_t>::value;
  const int64_t N = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3), K = rois.size(0);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor buf = at::zeros({N, H, W, C}, input.options().dtype(acc_dtype));
  const int32_t* ap = MAX ? argmax.data_ptr<int32_t>() : nullptr;
  const Strides4 as = MAX ? strides_of(argmax) : Strides4{0, 0, 0, 0};
  const int cap = roi_table_entries(p);
  auto launch = [&](auto vec_tag) {
    constexpr int VEC = decltype(vec_tag)::value;
    const int threads = threads_for(p.pooled_h * p.pooled_w * (kChunkC / VEC));
    const int64_t blocks = (C + kChunkC - 1) / kChunkC * K;
    backward_atomic_kernel<scalar_t, VEC, MAX><<<static_cast<unsigned>(std::min<int64_t>(blocks, int64_t(1) << 30)),
                                                 threads, cap * sizeof(AxisTap<acc_t>), stream>>>(
        grad.data_ptr<scalar_t>(), strides_of(grad), ap, as, rois.data_ptr<scalar_t>(), buf.data_ptr<acc_t>(), K, N,
        C, static_cast<int>(H), static_cast<int>(W), p, cap);
    ORBBEC_LAUNCH_CHECK();
  };
  bool launched = false;
  if constexpr (std::is_same<acc_t, float>::value) {
    if (C % 4 == 0) {
      launch(std::integral_constant<int, 4>());
      launched = true;
    }
  }
  if (!launched) launch(std::integral_constant<int, 1>());
  if (fmt == at::MemoryFormat::ChannelsLast) {
    const at::Tensor view = buf.permute({0, 3, 1, 2});
    if (acc_dtype == input.scalar_type()) return view;
    at::Tensor out = at::empty(input.sizes(), input.options().memory_format(fmt));
    out.copy_(view);  // same layout, an elementwise conversion
    return out;
  }
  at::Tensor out = at::empty(input.sizes(), input.options());
  const int64_t tiles = N * ((C + 31) / 32) * ((H * W + 31) / 32);
  nhwc_to_nchw_kernel<acc_t, scalar_t><<<static_cast<unsigned>(std::min<int64_t>(tiles, int64_t(1) << 30)),
                                         dim3(32, 8), 0, stream>>>(buf.data_ptr<acc_t>(), out.data_ptr<scalar_t>(),
                                                                   N, C, H * W);
  ORBBEC_LAUNCH_CHECK();
  return out;
}

}  // namespace
}  // namespace roi_align
}  // namespace orbbec
