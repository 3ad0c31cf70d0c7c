// Deterministic backward of roi_align: gathers, no atomics (see roi_align_cuda.cu).
#pragma once
#include "roi_align/src/cuda/roi_align_forward.cuh"

namespace orbbec {
namespace roi_align {
namespace {  // one translation unit (roi_align_cuda.cu) includes these headers

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
__global__ void roi_geometry_kernel(const scalar_t* __restrict__ rois, RoiGeom<acc_type<scalar_t>>* geoms,
                                    RoiCull* culls, int64_t K, int64_t N, int H, int W, Params p) {
  using acc_t = acc_type<scalar_t>;
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
__global__ void __launch_bounds__(gather_channels<acc_type<scalar_t>>())
    backward_gather_kernel(const scalar_t* __restrict__ grad, Strides4 gs, const int32_t* __restrict__ argmax,
                           Strides4 as, const RoiGeom<acc_type<scalar_t>>* __restrict__ geoms,
                           const RoiCull* __restrict__ culls, int64_t K,
                           int64_t N, int64_t C, int H, int W, int64_t PH, int64_t PW, scalar_t* __restrict__ gin,
                           Strides4 is) {
  using acc_t = acc_type<scalar_t>;
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
  using acc_t = acc_type<scalar_t>;
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

}  // namespace
}  // namespace roi_align
}  // namespace orbbec
