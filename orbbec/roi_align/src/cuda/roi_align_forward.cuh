// Forward kernels of roi_align and the choice between them (see roi_align_cuda.cu).
#pragma once
#include "roi_align/src/cuda/roi_align_common.cuh"

namespace orbbec {
namespace roi_align {
namespace {  // one translation unit (roi_align_cuda.cu) includes these headers

// input: channels_last [N, H, W, C] memory; VEC channels per thread (C % VEC == 0, 16-byte aligned).
template <typename scalar_t, int VEC, bool MAX>
__global__ void __launch_bounds__(kMaxThreads)
    forward_cl_kernel(const scalar_t* __restrict__ input, const scalar_t* __restrict__ rois, scalar_t* __restrict__ out,
                      Strides4 os, int32_t* __restrict__ argmax, int64_t K, int64_t N, int64_t C, int H, int W,
                      Params p) {
  using acc_t = acc_type<scalar_t>;
  __shared__ AxisTap<acc_t> ytab[kTabY];
  __shared__ AxisTap<acc_t> xtab[kTabX];
  const int64_t PH = p.pooled_h, PW = p.pooled_w, CG = C / VEC;
  for (int64_t row = blockIdx.x; row < K * PH; row += gridDim.x) {
    const int64_t k = row / PH, ph = row - k * PH;
    RoiGeom<acc_t> g;
    const bool tab = prepare_row(rois, k, ph, N, H, W, p, g, ytab, xtab);
    const scalar_t* img = input + (g.batch >= 0 ? g.batch : 0) * H * W * C;
    for (int64_t item = threadIdx.x; item < PW * CG; item += blockDim.x) {
      const int64_t pw = item / CG, c0 = (item - pw * CG) * VEC;
      const scalar_t* base = img + c0;
      auto tap_y = [&](int iy) {
        return tab ? ytab[iy] : axis_tap(sample_coord(g.start_y, g.bin_h, ph, iy, g.grid_h), H);
      };
      auto tap_x = [&](int ix) {
        return tab ? xtab[pw * g.grid_w + ix] : axis_tap(sample_coord(g.start_x, g.bin_w, pw, ix, g.grid_w), W);
      };
      auto load = [&](int y, int x, acc_t* v) {
        const Vec<scalar_t, VEC> raw =
            *reinterpret_cast<const Vec<scalar_t, VEC>*>(base + (static_cast<int64_t>(y) * W + x) * C);
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[i] = static_cast<acc_t>(raw.v[i]);
      };
      acc_t acc[VEC];
      int32_t arg[VEC];
      pool_bin<MAX, VEC>(g.grid_h, g.grid_w, tap_y, tap_x, load, acc, arg);
      store_bin<MAX, VEC>(out, os, argmax, k, c0, ph, pw, acc, arg, g.count);
    }
  }
}

// input: contiguous NCHW with H * W < 2^31. One block per (chunk of chunk_c channels, roi), rois
// fastest: the blocks in flight at once pool all rois from the same few channel planes, which stay
// in L2 (pooling roi by roi over all channels would stream the whole map from DRAM about once per
// overlapping roi). The roi's taps are computed once into shared memory for all its channels; a
// thread pools one output (channel, ph, pw), so a warp reads one or two planes near the roi and
// writes consecutive outputs.
template <typename scalar_t, bool MAX>
__global__ void __launch_bounds__(kMaxThreads)
    forward_nchw_kernel(const scalar_t* __restrict__ input, const scalar_t* __restrict__ rois,
                        scalar_t* __restrict__ out, Strides4 os, int32_t* __restrict__ argmax, int64_t K, int64_t N,
                        int64_t C, int H, int W, Params p, int chunk_c, int cap) {
  using acc_t = acc_type<scalar_t>;
  extern __shared__ __align__(16) unsigned char roi_smem[];
  AxisTap<acc_t>* const tab = reinterpret_cast<AxisTap<acc_t>*>(roi_smem);
  const int PW = static_cast<int>(p.pooled_w), bins = static_cast<int>(p.pooled_h * p.pooled_w);
  const int64_t HW = static_cast<int64_t>(H) * W, chunks = (C + chunk_c - 1) / chunk_c;
  for (int64_t blk = blockIdx.x; blk < chunks * K; blk += gridDim.x) {
    const int64_t chunk = blk / K, k = blk - chunk * K;
    RoiGeom<acc_t> g;
    const bool tabled = prepare_roi(rois, k, N, H, W, W, p, cap, g, tab);
    const AxisTap<acc_t>* const xtab = tab + p.pooled_h * g.grid_h;
    const int64_t c_begin = chunk * chunk_c;
    const int items = static_cast<int>(std::min<int64_t>(chunk_c, C - c_begin)) * bins;
    const scalar_t* const planes = input + ((g.batch >= 0 ? g.batch : 0) * C + c_begin) * HW;
    for (int item = threadIdx.x; item < items; item += blockDim.x) {
      const int c = item / bins, bin = item - c * bins, ph = bin / PW, pw = bin - ph * PW;
      const scalar_t* const plane = planes + c * HW;
      auto tap_y = [&](int iy) {
        return tabled ? tab[ph * g.grid_h + iy]
                      : row_tap(axis_tap(sample_coord(g.start_y, g.bin_h, ph, iy, g.grid_h), H), W);
      };
      auto tap_x = [&](int ix) {
        return tabled ? xtab[pw * g.grid_w + ix] : axis_tap(sample_coord(g.start_x, g.bin_w, pw, ix, g.grid_w), W);
      };
      // y is a row offset (row_tap), so y + x < H * W indexes the plane in 32 bits.
      auto load = [&](int y, int x, acc_t* v) { v[0] = static_cast<acc_t>(plane[y + x]); };
      acc_t acc[1];
      int32_t arg[1];
      pool_bin<MAX, 1>(g.grid_h, g.grid_w, tap_y, tap_x, load, acc, arg);
      store_bin<MAX, 1>(out, os, argmax, k, c_begin + c, ph, pw, acc, arg, g.count);
    }
  }
}

// Channels one thread pools in turn, with the same taps, in forward_fixed_kernel.
constexpr int kFixedChannels = 8;
// Its largest block: 7 warps, so that 4 blocks of 72 registers a thread fit an SM's 64K registers.
constexpr int kFixedThreads = 224;

// input: contiguous NCHW with H * W < 2^31; a fixed grid of SR x SR samples per bin, SR = 1, 2 or 4.
// Same block order as forward_nchw_kernel (one block per (chunk of channels, roi), rois fastest, so
// the planes being pooled stay in L2), but built for the throughput of the L1 and of issue slots:
//  - SR lanes per output, lane j taking sample column j of every sample row: a warp's loads then
//    lie along about one row of bins (16 bins x 2 columns for SR = 2) rather than two to five (32
//    bins, 7 or 14 to a row), so each load instruction touches about half as many cache lines.
//    The lanes' values meet in the first lane by shuffles, which pools them in sample order (iy,
//    then ix), so the sums and the max (ties: the first sample) are bit for bit those of pool_bin.
//  - A thread computes the taps of its samples once, in registers (no shared table, no barrier),
//    and pools kFixedChannels channels with them; the channel loop is unrolled so that a thread
//    has 16 loads (4 samples) in flight. Registers are held to 72 so that 4 blocks share an SM
//    (SR = 4, which keeps the weights and offsets of 4 samples across the loop, gets twice as
//    many, lest they spill).
//  - `groups` thread groups per block each take kFixedChannels channels, so that small bin counts
//    (7 x 7 bins x 2 lanes) still fill most lanes of the block's warps.
// Items t = (group, bin, column) are padded to whole warps: every lane of a warp runs the same
// loops and reaches every shuffle; padding lanes (and channels past C) load and store nothing.
template <typename scalar_t, bool MAX, int SR>
__global__ void __launch_bounds__(kFixedThreads, SR == 4 ? 2 : 4)
    forward_fixed_kernel(const scalar_t* __restrict__ input, const scalar_t* __restrict__ rois,
                         scalar_t* __restrict__ out, Strides4 os, int32_t* __restrict__ argmax, int64_t K, int64_t N,
                         int64_t C, int H, int W, Params p, int groups) {
  static_assert(SR == 1 || SR == 2 || SR == 4, "the lanes of an output must divide a warp");
  using acc_t = acc_type<scalar_t>;
  constexpr int kUnroll = 4 / SR;  // channels in flight per thread: 4 samples, 16 loads
  const int PW = static_cast<int>(p.pooled_w), bins = static_cast<int>(p.pooled_h * p.pooled_w);
  const int slots = bins * SR, items = groups * slots, padded = (items + 31) / 32 * 32;
  const int64_t HW = static_cast<int64_t>(H) * W, chunk_c = static_cast<int64_t>(groups) * kFixedChannels;
  const int64_t chunks = (C + chunk_c - 1) / chunk_c;
  for (int64_t blk = blockIdx.x; blk < chunks * K; blk += gridDim.x) {
    const int64_t chunk = blk / K, k = blk - chunk * K;
    const RoiGeom<acc_t> g = make_geom<acc_t>(rois + k * 5, N, p);
    const bool empty = g.batch < 0;  // the same for the whole block: pools zeros, argmax -1
    const int64_t c_begin = chunk * chunk_c;
    const int c_len = static_cast<int>(std::min<int64_t>(chunk_c, C - c_begin));
    // blockDim.x and padded are whole warps, so all lanes of a warp take the same trip count.
    for (int t = threadIdx.x; t < padded; t += blockDim.x) {
      const bool active = t < items;
      const int tt = active ? t : 0;
      const int grp = tt / slots, s = tt - grp * slots, bin = s / SR, col = s - bin * SR;
      const int ph = bin / PW, pw = bin - ph * PW;
      // Taps of this lane's samples: rows iy (as row offsets, row_tap), column col.
      AxisTap<acc_t> ty[SR];
#pragma unroll
      for (int iy = 0; iy < SR; ++iy) ty[iy] = row_tap(axis_tap(sample_coord(g.start_y, g.bin_h, ph, iy, SR), H), W);
      const AxisTap<acc_t> tx = axis_tap(sample_coord(g.start_x, g.bin_w, pw, col, SR), W);
      const int c_first = grp * kFixedChannels;  // within the chunk
      const scalar_t* plane = input + ((empty ? 0 : g.batch) * C + c_begin + c_first) * HW;
      const int64_t o_first = k * os.k + (c_begin + c_first) * os.c + ph * os.h + pw * os.w;
#pragma unroll kUnroll
      for (int i = 0; i < kFixedChannels; ++i, plane += HW) {
        const bool live = active && !empty && c_first + i < c_len;
        // This lane's samples, 0 outside the map (avg: adding 0 leaves the sum's bits unchanged, as
        // it starts at +0 and so is never -0; max: an outside sample is 0 and competes).
        acc_t val[SR];
#pragma unroll
        for (int iy = 0; iy < SR; ++iy) {
          const AxisTap<acc_t> a = ty[iy];
          val[iy] = acc_t(0);
          if (live && a.lo >= 0 && tx.lo >= 0) {
            const acc_t p00 = static_cast<acc_t>(plane[a.lo + tx.lo]), p01 = static_cast<acc_t>(plane[a.lo + tx.hi]);
            const acc_t p10 = static_cast<acc_t>(plane[a.hi + tx.lo]), p11 = static_cast<acc_t>(plane[a.hi + tx.hi]);
            const acc_t w00 = a.wlo * tx.wlo, w01 = a.wlo * tx.whi;
            const acc_t w10 = a.whi * tx.wlo, w11 = a.whi * tx.whi;
            val[iy] = w00 * p00 + w01 * p01 + w10 * p10 + w11 * p11;  // pool_bin's order
          }
        }
        // Pool in sample order: row iy, then column j (lane j of the output's SR lanes).
        acc_t acc = MAX ? -static_cast<acc_t>(INFINITY) : acc_t(0);
        int32_t arg = -1;
        if (!empty) {  // uniform over the block, so every lane of a warp reaches the shuffles
#pragma unroll
          for (int iy = 0; iy < SR; ++iy) {
#pragma unroll
            for (int j = 0; j < SR; ++j) {
              // Column 0 reads column j's value (the other lanes' results are not used).
              const acc_t v = j == 0 ? val[iy] : __shfl_down_sync(0xffffffffu, val[iy], j, SR);
              if (MAX) {
                if (v > acc) {
                  acc = v;
                  arg = iy * SR + j;
                }
              } else {
                acc += v;
              }
            }
          }
        }
        if (active && col == 0 && c_first + i < c_len) {
          const int64_t o = o_first + i * os.c;
          out[o] = static_cast<scalar_t>(bin_value<MAX>(acc, arg, g.count));
          if (argmax != nullptr) argmax[o] = arg;
        }
      }
    }
  }
}

// Whether to convert an NCHW map to channels_last before pooling: when the taps the rois read
// (estimated with 2x2 samples per bin if adaptive) outnumber the map's pixels.
bool convert_pays(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, const Params& p) {
  if (C < 16) return false;
  const double samples = p.sampling_ratio > 0 ? double(p.sampling_ratio) * double(p.sampling_ratio) : 4.0;
  return double(K) * double(p.pooled_h) * double(p.pooled_w) * samples * 4.0 >= double(N) * double(H) * double(W);
}

// Whether to pool an NCHW map in place (forward_nchw_kernel) rather than convert it. Fixed grids of
// up to 4x4 samples always do: with the planes in L2, reading them through L1 costs less than the
// conversion's pass over the whole map plus the channels_last kernel's strided NCHW stores.
// Adaptive grids can be much denser (unknown without reading the rois), where the channels_last
// kernel's 16-byte loads win, so they keep the estimate of convert_pays.
bool pool_in_place(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, const Params& p) {
  const int64_t kInt32 = int64_t(1) << 31;
  if (H * W >= kInt32 || p.pooled_h * p.pooled_w >= (int64_t(1) << 24)) return false;  // 32-bit indices
  if (p.sampling_ratio > 0 && p.sampling_ratio <= 4) return true;
  return !convert_pays(N, C, H, W, K, p);
}

template <typename scalar_t, bool MAX, int SR>
void launch_fixed(const at::Tensor& x, const at::Tensor& rois, at::Tensor& out, int32_t* argmax, const Params& p) {
  const int64_t K = rois.size(0), C = x.size(1), slots = p.pooled_h * p.pooled_w * SR;  // SR lanes per bin
  // Thread groups (of kFixedChannels channels each) per block: the fewest that keep at least 7/8 of
  // the lanes of the block's padded warps busy, up to 4 (and no more than the channels need).
  const int64_t max_groups = std::min<int64_t>(4, (C + kFixedChannels - 1) / kFixedChannels);
  int64_t groups = 1;
  double best = 0;
  for (int64_t gr = 1; gr <= max_groups; ++gr) {
    const double eff = double(gr * slots) / double((gr * slots + 31) / 32 * 32);
    if (eff > best + 1e-9) {
      best = eff;
      groups = gr;
    }
    if (eff >= 0.875) break;
  }
  const int threads = threads_for((groups * slots + 31) / 32 * 32, kFixedThreads);
  const int64_t chunk_c = groups * kFixedChannels;
  const int64_t blocks = (C + chunk_c - 1) / chunk_c * K;
  forward_fixed_kernel<scalar_t, MAX, SR><<<static_cast<unsigned>(std::min<int64_t>(blocks, int64_t(1) << 30)), threads,
                                            0, c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<scalar_t>(), rois.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), strides_of(out), argmax, K,
      x.size(0), C, static_cast<int>(x.size(2)), static_cast<int>(x.size(3)), p, static_cast<int>(groups));
  ORBBEC_LAUNCH_CHECK();
}

template <typename scalar_t, bool MAX>
void launch_nchw(const at::Tensor& x, const at::Tensor& rois, at::Tensor& out, int32_t* argmax, const Params& p) {
  using acc_t = acc_type<scalar_t>;
  // Fixed grids whose sample columns divide a warp; 3 x 3 (and adaptive) grids keep one thread per
  // output with a shared tap table.
  switch (p.sampling_ratio) {
    case 1: return launch_fixed<scalar_t, MAX, 1>(x, rois, out, argmax, p);
    case 2: return launch_fixed<scalar_t, MAX, 2>(x, rois, out, argmax, p);
    case 4: return launch_fixed<scalar_t, MAX, 4>(x, rois, out, argmax, p);
    default: break;
  }
  const int64_t K = rois.size(0), C = x.size(1), bins = p.pooled_h * p.pooled_w;
  // Channels per block: enough bins to fill kMaxThreads threads (one round when bins < kMaxThreads).
  const int64_t chunk_c = bins >= kMaxThreads ? 1 : std::min<int64_t>(C, kMaxThreads / bins);
  const int threads = threads_for(chunk_c * bins);
  const int cap = roi_table_entries(p);
  const int64_t blocks = (C + chunk_c - 1) / chunk_c * K;
  forward_nchw_kernel<scalar_t, MAX><<<static_cast<unsigned>(std::min<int64_t>(blocks, int64_t(1) << 30)), threads,
                                       cap * sizeof(AxisTap<acc_t>), c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<scalar_t>(), rois.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), strides_of(out), argmax, K,
      x.size(0), C, static_cast<int>(x.size(2)), static_cast<int>(x.size(3)), p, static_cast<int>(chunk_c), cap);
  ORBBEC_LAUNCH_CHECK();
}

template <typename scalar_t, int VEC, bool MAX>
void launch_cl(const at::Tensor& x, const at::Tensor& rois, at::Tensor& out, int32_t* argmax, const Params& p) {
  const int64_t K = rois.size(0), C = x.size(1);
  // Threads cover the (pw, channel group) items of a bin row in as few equal rounds as possible.
  const int threads = threads_for(p.pooled_w * (C / VEC));
  const int64_t rows = K * p.pooled_h;
  forward_cl_kernel<scalar_t, VEC, MAX><<<grid_for(rows * threads, threads), threads, 0,
                                          c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<scalar_t>(), rois.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), strides_of(out), argmax, K,
      x.size(0), C, static_cast<int>(x.size(2)), static_cast<int>(x.size(3)), p);
  ORBBEC_LAUNCH_CHECK();
}

// Pools into out (any strides); argmax, when given, has out's strides. The backward of max mode
// calls this again with the same input, so it takes the same path and resolves ties the same way.
template <typename scalar_t, bool MAX>
void launch_forward(const at::Tensor& input, const at::Tensor& rois, at::Tensor& out, int32_t* argmax,
                    const Params& p) {
  const int64_t N = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3), K = rois.size(0);
  const bool cl = input.is_contiguous(at::MemoryFormat::ChannelsLast);
  if (!cl && pool_in_place(N, C, H, W, K, p)) {
    launch_nchw<scalar_t, MAX>(input.contiguous(), rois, out, argmax, p);
    return;
  }
  const at::Tensor x = input.contiguous(at::MemoryFormat::ChannelsLast);
  constexpr int kVec = 16 / sizeof(scalar_t);
  if (C % kVec == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0) {
    launch_cl<scalar_t, kVec, MAX>(x, rois, out, argmax, p);
  } else {
    launch_cl<scalar_t, 1, MAX>(x, rois, out, argmax, p);
  }
}

}  // namespace
}  // namespace roi_align
}  // namespace orbbec
