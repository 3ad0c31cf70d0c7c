// What the roi_align CUDA kernels share: block-size constants, the shared tap tables of a
// roi or a bin row, and the store of a pooled bin. Included by roi_align_cuda.cu only.
#pragma once
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
namespace {  // one translation unit (roi_align_cuda.cu) includes these headers

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

}  // namespace
}  // namespace roi_align
}  // namespace orbbec
