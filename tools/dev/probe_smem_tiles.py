"""Feasibility probe, run on the GPU machine (needs CuPy): `python tools/dev/probe_smem_tiles.py`.

Finished experiment; what it found is in docs/dev/warpaffine.md ("Tried and rejected").
Not part of orbbec: det NCHW uint8 with each block's source box staged in shared memory by 16-byte
loads, then the taps read from there (the idea for det's L1-bound gathers, docs/dev/warpaffine.md).
The kernel computes inner pixels only (others are written as 0); where it wrote a nonzero value it
must equal orbbec's bit for bit. Timed as groups of 10 back-to-back launches, like tools/timing.py.
"""
import os
import argparse

# Arguments first: --help works without CuPy or a GPU.
argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

import sys

import cupy as cp
import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from timing import cuda_time_ms  # noqa: E402
from workloads import WARP_WORKLOADS, forward_matrices, photos_bgr  # noqa: E402
from orbbec.warpaffine import invert_affine, warp_affine  # noqa: E402

KERNEL = r'''
// Probe: det NCHW uint8 bilinear with each block's source box staged in shared memory.
// Block: 256 threads, a 32 x 32 output tile; thread (tx = t % 8, ty = t / 8) computes pixels
// X0 + 4 tx + i (i < 4) of row Y0 + ty and writes each channel's 4 pixels as one 32-bit word.
// Needs W % 16 == 0 and OW % 4 == 0 (det: 640). Pixels whose taps fall outside the image (or
// outside the staged box) are written as 0 here: the probe times the inner path only.
__device__ __forceinline__ float blend(float p00, float p01, float p10, float p11, float fx, float fy) {
  float v0 = __fadd_rn(p00, __fmul_rn(fx, __fsub_rn(p01, p00)));
  float v1 = __fadd_rn(p10, __fmul_rn(fx, __fsub_rn(p11, p10)));
  return __fadd_rn(v0, __fmul_rn(fy, __fsub_rn(v1, v0)));
}
__device__ __forceinline__ unsigned to_u8(float v) {
  float c = fminf(fmaxf(v, 0.f), 255.f); return __float_as_uint(__fadd_rn(c, 8388608.f)) & 0xFFu;
}
// a byte as a float without the conversion unit (exact)
__device__ __forceinline__ float u8f(unsigned char v) { return __fsub_rn(__uint_as_float(0x4B000000u | v), 8388608.f); }
__device__ __forceinline__ float coord(double m0f, double rtf, double x) {
  return (float)__dadd_rn(__dmul_rn(m0f, x), rtf);
}
extern "C" __global__ void __launch_bounds__(256) smem_warp(const unsigned char* __restrict__ img, const double* __restrict__ M,
                                                             unsigned char* __restrict__ out, int H, int W, int OH, int OW,
                                                             int cap, int* __restrict__ overflow) {
  extern __shared__ __align__(16) unsigned char sm[];
  __shared__ int box[4];
  const int X0 = blockIdx.x * 32, Y0 = blockIdx.y * 32, b = blockIdx.z, t = threadIdx.x;
  const double* m = M + b * 6;
  const double m0 = (double)(float)m[0], m3 = (double)(float)m[3];
  if (t == 0) {
    float xs[4], ys[4];
    for (int k = 0; k < 4; ++k) {
      const double x = X0 + (k & 1) * 31, y = Y0 + (k >> 1) * 31;
      xs[k] = coord(m0, (double)(float)__dadd_rn(__dmul_rn(m[1], y), m[2]), x);
      ys[k] = coord(m3, (double)(float)__dadd_rn(__dmul_rn(m[4], y), m[5]), x);
    }
    const float lo_x = fminf(fminf(xs[0], xs[1]), fminf(xs[2], xs[3])), hi_x = fmaxf(fmaxf(xs[0], xs[1]), fmaxf(xs[2], xs[3]));
    const float lo_y = fminf(fminf(ys[0], ys[1]), fminf(ys[2], ys[3])), hi_y = fmaxf(fmaxf(ys[0], ys[1]), fmaxf(ys[2], ys[3]));
    // one pixel of margin for rounding, one more for the second tap; clamped to the image
    box[0] = max(0, (int)floorf(fmaxf(lo_x, -1e6f)) - 1) & ~15;
    box[1] = min(W - 1, (int)floorf(fminf(hi_x, 1e6f)) + 2);
    box[2] = max(0, (int)floorf(fmaxf(lo_y, -1e6f)) - 1);
    box[3] = min(H - 1, (int)floorf(fminf(hi_y, 1e6f)) + 2);
  }
  __syncthreads();
  const int bx0 = box[0], bx1 = box[1], by0 = box[2], by1 = box[3];
  const int tx = t % 8, ty = t / 8, y = Y0 + ty, xb = X0 + 4 * tx;
  const bool empty = bx1 < bx0 || by1 < by0;
  const int n16 = empty ? 0 : (bx1 + 1 - bx0 + 15) / 16, rows = empty ? 0 : by1 - by0 + 1;
  const int pitch = n16 * 16 + 16;
  const bool fits = n16 <= 8 && 3 * rows * pitch <= cap;
  if (!fits && t == 0) atomicAdd(overflow, 1);
  if (fits) {
    // 8 lanes per staged row (16 bytes each, lanes past n16 idle): no integer division per chunk
    const int k = t % 8;
    for (int cr = t / 8; cr < 3 * rows; cr += 32) {
      const int c = cr >= rows ? (cr >= 2 * rows ? 2 : 1) : 0, r = cr - c * rows;
      if (k < n16) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(img + ((size_t)(b * 3 + c) * H + by0 + r) * W + bx0) + k);
        *reinterpret_cast<uint4*>(sm + cr * pitch + 16 * k) = v;
      }
    }
  }
  __syncthreads();
  if (y >= OH || xb >= OW) return;
  const double rx = (double)(float)__dadd_rn(__dmul_rn(m[1], (double)y), m[2]);
  const double ry = (double)(float)__dadd_rn(__dmul_rn(m[4], (double)y), m[5]);
  unsigned word[3] = {0u, 0u, 0u};
  for (int i = 0; i < 4; ++i) {
    const double xd = xb + i;
    const float sx = coord(m0, rx, xd), sy = coord(m3, ry, xd);
    const int ix = __float2int_rd(sx), iy = __float2int_rd(sy);
    const float fx = sx - (float)ix, fy = sy - (float)iy;
    const bool in = fits && fabsf(sx) < 1e6f && fabsf(sy) < 1e6f && ix >= bx0 && ix < bx1 && iy >= by0 && iy < by1 &&
                    (unsigned)ix < (unsigned)(W - 1) && (unsigned)iy < (unsigned)(H - 1);
    if (in) {
      const unsigned char* q = sm + (iy - by0) * pitch + (ix - bx0);
#pragma unroll
      for (int c = 0; c < 3; ++c) {
        const unsigned char* qc = q + c * rows * pitch;
        const float v = blend(u8f(qc[0]), u8f(qc[1]), u8f(qc[pitch]), u8f(qc[pitch + 1]), fx, fy);
        word[c] |= to_u8(v) << (8 * i);
      }
    }
  }
#pragma unroll
  for (int c = 0; c < 3; ++c) *reinterpret_cast<unsigned*>(out + ((size_t)(b * 3 + c) * OH + y) * OW + xb) = word[c];
}
'''

B, (H, W), (OH, OW) = WARP_WORKLOADS["det"]
x = torch.from_numpy(np.stack(photos_bgr(B, (H, W)))).permute(0, 3, 1, 2).contiguous().cuda()
inv = invert_affine(torch.from_numpy(forward_matrices(B, (H, W), (OH, OW))).cuda())
ref = cp.asarray(warp_affine(x, inv, (OW, OH), inverse_map=True))
kernel = cp.RawModule(code=KERNEL, options=("--fmad=false",)).get_function("smem_warp")
img, mats = cp.asarray(x), cp.asarray(inv.contiguous())
out = cp.zeros((B, 3, OH, OW), cp.uint8)
overflow = cp.zeros(1, cp.int32)
grid = ((OW + 31) // 32, (OH + 31) // 32, B)
for cap in (16384, 24576):
    def run():
        kernel(grid, (256,), (img, mats, out, np.int32(H), np.int32(W), np.int32(OH), np.int32(OW), np.int32(cap), overflow),
               shared_mem=cap)
    overflow.fill(0); out.fill(0); run(); cp.cuda.Device().synchronize()
    nz = out != 0
    print(f"cap {cap} B: blocks over the cap {int(overflow[0])} of {grid[0] * grid[1] * grid[2]}; nonzero values "
          f"{int(nz.sum())} (orbbec {int((ref != 0).sum())}); equal to orbbec on {float((out == ref)[nz].mean()) * 100:.4f}% of them")
    s, e = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(3):
        run()
    ts = []
    for _ in range(5):
        run()
        s.record()
        for _ in range(10):
            run()
        e.record()
        e.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s, e) / 10)
    print(f"shared-memory tiles, cap {cap} B: {sorted(ts)[2] * 1e3:.1f} us per det batch (median of 5 groups of 10)")
ms = cuda_time_ms(lambda: warp_affine(x, inv, (OW, OH), inverse_map=True), 50)
print(f"orbbec warp_affine NCHW, same batch: {ms * 1e3:.1f} us")
