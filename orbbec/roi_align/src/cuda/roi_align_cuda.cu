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
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <type_traits>

#include "common/src/cuda_utils.cuh"
#include "roi_align/src/roi_align_ext.h"

namespace orbbec {
namespace roi_align {
namespace {

constexpr int kMaxThreads = 256;
// Shared tables of one bin row's taps: up to kTabY samples along y and kTabX along x (all bins of
// the row). Larger (adaptive) grids compute their taps on the fly.
constexpr int kTabY = 64;
constexpr int kTabX = 512;
// Per-roi tap tables (all bins of a roi, y then x) of the NCHW forward and the atomic backward.
constexpr int kTabRoi = 512;
// Channels per block of the atomic backward: 32 float accumulators, one 128-byte line per pixel.
constexpr int kChunkC = 32;
constexpr int kTile = 8;  // deterministic backward: tiles of kTile x kTile gradient pixels

struct Strides4 {
  int64_t k, c, h, w;
};
Strides4 strides_of(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; }

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

// Every thread of the block: the geometry of roi k and, when they fit, the taps of bin row ph in
// the shared tables. Returns whether the tables hold them.
template <typename acc_t, typename scalar_t>
__device__ bool prepare_row(const scalar_t* rois, int64_t k, int64_t ph, int64_t N, int H, int W, const Params& p,
                            RoiGeom<acc_t>& g, AxisTap<acc_t>* ytab, AxisTap<acc_t>* xtab) {
  g = make_geom<acc_t>(rois + k * 5, N, p);
  const int64_t nx = p.pooled_w * g.grid_w;
  const bool tab = g.grid_h <= kTabY && nx <= kTabX;
  __syncthreads();  // the previous row's readers are done with the tables
  if (tab) {
    for (int i = threadIdx.x; i < g.grid_h; i += blockDim.x)
      ytab[i] = axis_tap(sample_coord(g.start_y, g.bin_h, ph, i, g.grid_h), H);
    for (int j = threadIdx.x; j < nx; j += blockDim.x) {
      const int pw = j / g.grid_w;
      xtab[j] = axis_tap(sample_coord(g.start_x, g.bin_w, pw, j - pw * g.grid_w, g.grid_w), W);
    }
  }
  __syncthreads();
  return tab;
}

// Writes VEC consecutive channels of one bin (and their argmax, which shares out's strides).
template <bool MAX, int VEC, typename scalar_t, typename acc_t>
__device__ __forceinline__ void store_bin(scalar_t* out, const Strides4& os, int32_t* argmax, int64_t k, int64_t c0,
                                          int64_t ph, int64_t pw, const acc_t* acc, const int32_t* arg, acc_t count) {
  const int64_t o = k * os.k + c0 * os.c + ph * os.h + pw * os.w;
  if (VEC > 1 && os.c == 1) {
    Vec<scalar_t, VEC> r;
#pragma unroll
    for (int i = 0; i < VEC; ++i) r.v[i] = static_cast<scalar_t>(bin_value<MAX>(acc[i], arg[i], count));
    *reinterpret_cast<Vec<scalar_t, VEC>*>(out + o) = r;
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[o + i * os.c] = static_cast<scalar_t>(bin_value<MAX>(acc[i], arg[i], count));
  }
  if (argmax != nullptr) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) argmax[o + i * os.c] = arg[i];
  }
}

// input: channels_last [N, H, W, C] memory; VEC channels per thread (C % VEC == 0, 16-byte aligned).
template <typename scalar_t, int VEC, bool MAX>
__global__ void __launch_bounds__(kMaxThreads)
    forward_cl_kernel(const scalar_t* __restrict__ input, const scalar_t* __restrict__ rois, scalar_t* __restrict__ out,
                      Strides4 os, int32_t* __restrict__ argmax, int64_t K, int64_t N, int64_t C, int H, int W,
                      Params p) {
  using acc_t = at::opmath_type<scalar_t>;
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

// Threads of a block that covers `items` work items in as few equal rounds of at most max_threads
// as possible, rounded up to whole warps.
int threads_for(int64_t items, int max_threads = kMaxThreads) {
  const int64_t rounds = (items + max_threads - 1) / max_threads;
  return static_cast<int>(std::min<int64_t>(max_threads, ((items + rounds - 1) / rounds + 31) / 32 * 32));
}

// Entries of the per-roi tap tables (prepare_roi) to reserve in dynamic shared memory: exactly what
// a fixed grid needs, or kTabAdaptive for adaptive grids (larger ones compute taps on the fly).
int roi_table_entries(const Params& p) {
  if (p.sampling_ratio > 0) {
    const int64_t need = (p.pooled_h + p.pooled_w) * p.sampling_ratio;
    return need <= kTabRoi ? static_cast<int>(need) : 0;
  }
  return kTabRoi;
}

// A y tap whose lo and hi are row offsets (multiplied by row) instead of row numbers; an outside
// tap keeps lo < 0.
template <typename acc_t>
__device__ __forceinline__ AxisTap<acc_t> row_tap(AxisTap<acc_t> t, int row) {
  if (t.lo >= 0) {
    t.lo *= row;
    t.hi *= row;
  }
  return t;
}

// Every thread of the block: the geometry of roi k and, when the taps of all its bins fit in cap
// entries, those taps in the shared table tab: y taps at [ph * grid_h + iy] (as row_tap(., row)),
// then x taps at [PH * grid_h + pw * grid_w + ix]. Returns whether the table holds them.
template <typename acc_t, typename scalar_t>
__device__ bool prepare_roi(const scalar_t* rois, int64_t k, int64_t N, int H, int W, int row, const Params& p,
                            int cap, RoiGeom<acc_t>& g, AxisTap<acc_t>* tab) {
  g = make_geom<acc_t>(rois + k * 5, N, p);
  const int64_t ny = p.pooled_h * g.grid_h, nx = p.pooled_w * g.grid_w;
  const bool fits = ny + nx <= cap;
  __syncthreads();  // the previous roi's readers are done with the table
  if (fits) {
    for (int i = threadIdx.x; i < ny; i += blockDim.x) {
      const int ph = i / g.grid_h;
      tab[i] = row_tap(axis_tap(sample_coord(g.start_y, g.bin_h, ph, i - ph * g.grid_h, g.grid_h), H), row);
    }
    for (int j = threadIdx.x; j < nx; j += blockDim.x) {
      const int pw = j / g.grid_w;
      tab[ny + j] = axis_tap(sample_coord(g.start_x, g.bin_w, pw, j - pw * g.grid_w, g.grid_w), W);
    }
  }
  __syncthreads();
  return fits;
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
  using acc_t = at::opmath_type<scalar_t>;
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
  using acc_t = at::opmath_type<scalar_t>;
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
  using acc_t = at::opmath_type<scalar_t>;
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

// ---------------------------------------------------------------------------------------------
// Backward with atomics

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
                           Strides4 as, const scalar_t* __restrict__ rois, at::opmath_type<scalar_t>* __restrict__ gbuf,
                           int64_t K, int64_t N, int64_t C, int H, int W, Params p, int cap) {
  using acc_t = at::opmath_type<scalar_t>;
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
  using acc_t = at::opmath_type<scalar_t>;
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

// ---------------------------------------------------------------------------------------------
// Deterministic backward (gather)

// What a block needs to decide whether a roi touches its tile, packed small because every block
// reads the record of every roi: the image (-1: none) and the pixels the roi's taps may touch
// (inclusive; empty when y0 > y1 or x0 > x1).
struct RoiCull {
  int batch, y0, y1, x0, x1;
};

// A sample whose taps touch the tile: its bin, its index in the bin, taps relative to the tile.
template <typename acc_t>
struct TileTap {
  int bin, idx, lo, hi;
  acc_t wlo, whi;
};

// Channels per block (one per thread); the tile's accumulators fill about 33 KB of shared memory.
template <typename acc_t>
constexpr int gather_channels() {
  return sizeof(acc_t) == 4 ? 128 : 64;
}

template <typename scalar_t>
__global__ void roi_geometry_kernel(const scalar_t* __restrict__ rois, RoiGeom<at::opmath_type<scalar_t>>* geoms,
                                    RoiCull* culls, int64_t K, int64_t N, int H, int W, Params p) {
  using acc_t = at::opmath_type<scalar_t>;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < K;
       k += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const RoiGeom<acc_t> g = make_geom<acc_t>(rois + k * 5, N, p);
    RoiCull c;
    c.batch = static_cast<int>(g.batch);  // N < 2^31 is checked
    axis_footprint(g.start_y, g.bin_h, p.pooled_h, g.grid_h, H, c.y0, c.y1);
    axis_footprint(g.start_x, g.bin_w, p.pooled_w, g.grid_w, W, c.x0, c.x1);
    geoms[k] = g;
    culls[k] = c;
  }
}

// Block-wide stream compaction that keeps thread order: returns the slot of a thread whose pred
// holds, and the number of such threads in total. Every thread of the block must call it.
__device__ __forceinline__ int block_compact(bool pred, int* warp_counts, int& total) {
  const unsigned ballot = __ballot_sync(0xffffffffu, pred);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  int before = 0;
  total = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) {
    const int n = warp_counts[w];
    before += w < warp ? n : 0;
    total += n;
  }
  __syncthreads();  // warp_counts is reused by the next call
  return before + __popc(ballot & ((1u << lane) - 1u));
}

// Collects, in sample order, the samples s0 + threadIdx.x of one axis (S in all) whose taps touch
// the tile [tile0, tile0 + kTile). Ends with a barrier, so the list is ready for every thread.
template <typename acc_t>
__device__ void collect_taps(int64_t s0, int64_t S, acc_t start, acc_t bin, int grid, int size, int tile0,
                             TileTap<acc_t>* list, int* warp_counts, int& n) {
  const int64_t s = s0 + threadIdx.x;
  TileTap<acc_t> e;
  bool keep = false;
  if (s < S) {
    const int64_t b = s / grid;
    const int i = static_cast<int>(s - b * grid);
    const AxisTap<acc_t> t = axis_tap(sample_coord(start, bin, b, i, grid), size);
    if (t.lo >= 0) {
      e.bin = static_cast<int>(b);
      e.idx = i;
      e.lo = t.lo - tile0;
      e.hi = t.hi - tile0;
      e.wlo = t.wlo;
      e.whi = t.whi;
      keep = (e.lo >= 0 && e.lo < kTile) || (e.hi >= 0 && e.hi < kTile);
    }
  }
  const int pos = block_compact(keep, warp_counts, n);
  if (keep) list[pos] = e;
  __syncthreads();
}

// grad and argmax: [K, C, PH, PW] with any strides (channels_last reads coalesce); gin: the input's
// gradient, any strides, every element written once.
template <typename scalar_t, bool MAX>
__global__ void __launch_bounds__(gather_channels<at::opmath_type<scalar_t>>())
    backward_gather_kernel(const scalar_t* __restrict__ grad, Strides4 gs, const int32_t* __restrict__ argmax,
                           Strides4 as, const RoiGeom<at::opmath_type<scalar_t>>* __restrict__ geoms,
                           const RoiCull* __restrict__ culls, int64_t K,
                           int64_t N, int64_t C, int H, int W, int64_t PH, int64_t PW, scalar_t* __restrict__ gin,
                           Strides4 is) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int CB = gather_channels<acc_t>();
  constexpr int kPix = kTile * kTile;
  constexpr int kRow = CB + 1;  // padded so that threads reading one channel of many pixels miss bank conflicts
  __shared__ acc_t acc[kPix * kRow];
  __shared__ TileTap<acc_t> ytaps[CB];
  __shared__ TileTap<acc_t> xtaps[CB];
  __shared__ int32_t hits[CB];
  __shared__ int warp_counts[CB / 32];
  const int tid = threadIdx.x;
  const int64_t tiles_y = (H + kTile - 1) / kTile, tiles_x = (W + kTile - 1) / kTile, chunks = (C + CB - 1) / CB;
  const int64_t total = N * tiles_y * tiles_x * chunks;
  for (int64_t blk = blockIdx.x; blk < total; blk += gridDim.x) {
    int64_t t = blk;
    const int64_t chunk = t % chunks;
    t /= chunks;
    const int tx0 = static_cast<int>(t % tiles_x) * kTile;
    t /= tiles_x;
    const int ty0 = static_cast<int>(t % tiles_y) * kTile;
    const int64_t n = t / tiles_y;
    const int64_t c = chunk * CB + tid;
    for (int i = tid; i < kPix * kRow; i += CB) acc[i] = acc_t(0);
    __syncthreads();

    for (int64_t r0 = 0; r0 < K; r0 += CB) {
      // The rois of this image whose footprint meets the tile, in roi order.
      const int64_t r = r0 + tid;
      bool hit = false;
      if (r < K) {
        const RoiCull b = culls[r];
        hit = b.batch == n && b.y0 <= ty0 + kTile - 1 && b.y1 >= ty0 && b.x0 <= tx0 + kTile - 1 && b.x1 >= tx0;
      }
      int nhit;
      const int pos = block_compact(hit, warp_counts, nhit);
      if (hit) hits[pos] = static_cast<int32_t>(r);
      __syncthreads();

      for (int h = 0; h < nhit; ++h) {
        const int64_t rr = hits[h];
        const RoiGeom<acc_t> g = geoms[rr];
        const int64_t Sy = PH * g.grid_h, Sx = PW * g.grid_w;
        for (int64_t sy0 = 0; sy0 < Sy; sy0 += CB) {
          int ny;
          collect_taps(sy0, Sy, g.start_y, g.bin_h, g.grid_h, H, ty0, ytaps, warp_counts, ny);
          if (ny == 0) continue;
          for (int64_t sx0 = 0; sx0 < Sx; sx0 += CB) {
            int nx;
            collect_taps(sx0, Sx, g.start_x, g.bin_w, g.grid_w, W, tx0, xtaps, warp_counts, nx);
            if (c < C) {
              acc_t* mine = acc + tid;
              for (int a = 0; a < ny; ++a) {
                const TileTap<acc_t> ey = ytaps[a];
                const scalar_t* grow = grad + rr * gs.k + c * gs.c + ey.bin * gs.h;
                const int32_t* arow = MAX ? argmax + rr * as.k + c * as.c + ey.bin * as.h : nullptr;
                for (int b = 0; b < nx; ++b) {
                  const TileTap<acc_t> ex = xtaps[b];
                  acc_t gv = static_cast<acc_t>(grow[ex.bin * gs.w]);
                  if (MAX) {
                    if (arow[ex.bin * as.w] != ey.idx * g.grid_w + ex.idx) continue;
                  } else {
                    gv = gv / g.count;
                  }
                  auto add = [&](int ly, int lx, acc_t w) {
                    if (static_cast<unsigned>(ly) < kTile && static_cast<unsigned>(lx) < kTile)
                      mine[(ly * kTile + lx) * kRow] += gv * w;
                  };
                  add(ey.lo, ex.lo, ey.wlo * ex.wlo);
                  add(ey.lo, ex.hi, ey.wlo * ex.whi);
                  add(ey.hi, ex.lo, ey.whi * ex.wlo);
                  add(ey.hi, ex.hi, ey.whi * ex.whi);
                }
              }
            }
            __syncthreads();  // the tap lists are rewritten next
          }
        }
      }
      __syncthreads();  // hits is rewritten next
    }

    // Write the tile: channel-fastest for a channels_last gradient, pixel-fastest for NCHW.
    const bool cl = is.c == 1;
    for (int i = tid; i < kPix * CB; i += CB) {
      const int cl_i = cl ? i % CB : i / kPix, px = cl ? i / CB : i % kPix;
      const int y = ty0 + px / kTile, x = tx0 + px % kTile;
      const int64_t ch = chunk * CB + cl_i;
      if (y < H && x < W && ch < C) {
        gin[n * is.k + ch * is.c + y * is.h + x * is.w] = static_cast<scalar_t>(acc[px * kRow + cl_i]);
      }
    }
    __syncthreads();  // acc is cleared next
  }
}

template <typename scalar_t, bool MAX>
at::Tensor backward_gather(const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& argmax,
                           const at::Tensor& input, at::MemoryFormat fmt, const Params& p) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int CB = gather_channels<acc_t>();
  const int64_t N = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3), K = rois.size(0);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  // Channel-contiguous gradient rows make the block's per-channel reads of a bin one coalesced run.
  const at::Tensor g = grad.contiguous(at::MemoryFormat::ChannelsLast);
  const auto bytes = input.options().dtype(at::kByte);
  at::Tensor geoms = at::empty({K * static_cast<int64_t>(sizeof(RoiGeom<acc_t>))}, bytes);
  at::Tensor culls = at::empty({K * static_cast<int64_t>(sizeof(RoiCull))}, bytes);
  auto* gp = reinterpret_cast<RoiGeom<acc_t>*>(geoms.data_ptr<uint8_t>());
  auto* cp = reinterpret_cast<RoiCull*>(culls.data_ptr<uint8_t>());
  roi_geometry_kernel<scalar_t><<<grid_for(K, 256), 256, 0, stream>>>(rois.data_ptr<scalar_t>(), gp, cp, K, N,
                                                                      static_cast<int>(H), static_cast<int>(W), p);
  ORBBEC_LAUNCH_CHECK();
  at::Tensor out = at::empty(input.sizes(), input.options().memory_format(fmt));
  const int64_t tiles = N * ((H + kTile - 1) / kTile) * ((W + kTile - 1) / kTile) * ((C + CB - 1) / CB);
  backward_gather_kernel<scalar_t, MAX><<<grid_for(tiles * CB, CB), CB, 0, stream>>>(
      g.data_ptr<scalar_t>(), strides_of(g), MAX ? argmax.data_ptr<int32_t>() : nullptr,
      MAX ? strides_of(argmax) : Strides4{0, 0, 0, 0}, gp, cp, K, N, C, static_cast<int>(H), static_cast<int>(W),
      p.pooled_h, p.pooled_w, out.data_ptr<scalar_t>(), strides_of(out));
  ORBBEC_LAUNCH_CHECK();
  return out;
}

// ---------------------------------------------------------------------------------------------

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
