"""Feasibility probe, run on the GPU machine (needs CuPy): `python tools/dev/probe_texture_gather.py`.

Finished experiment; what it found is in docs/dev/warpaffine.md ("Tried and rejected").
Not part of orbbec: does the texture unit's 2x2 gather (tld4) fetch det's NCHW taps faster than
orbbec's word loads? Det workload, first 32 images (a 2-D pitched texture holds at most 65,000
rows: 32 x 3 x 640 = 61,440). One thread per output pixel; the blend is orbbec's (cv2's order), so
inner pixels must equal orbbec's bit for bit; a plain byte-load kernel of the same shape is the
baseline. Timed as groups of 10 back-to-back launches, like tools/timing.py.
"""
import os
import argparse

# Arguments first: --help works without CuPy or a GPU.
argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

import sys, numpy as np, torch, cupy as cp
from cupy.cuda import texture, runtime
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from timing import cuda_time_ms
from workloads import WARP_WORKLOADS, photos_bgr, forward_matrices
from orbbec.warpaffine import warp_affine, invert_affine
B0, (H, W), (OH, OW) = WARP_WORKLOADS["det"]
B = 32
x = torch.from_numpy(np.stack(photos_bgr(B, (H, W)))).permute(0, 3, 1, 2).contiguous().cuda()
inv = invert_affine(torch.from_numpy(forward_matrices(B, (H, W), (OH, OW))).cuda())
ref = warp_affine(x, inv, (OW, OH), inverse_map=True)
xc = cp.asarray(x).reshape(B * 3 * H, W)
ch = texture.ChannelFormatDescriptor(8, 0, 0, 0, runtime.cudaChannelFormatKindUnsigned)
res = texture.ResourceDescriptor(runtime.cudaResourceTypePitch2D, arr=xc, chDesc=ch, width=W, height=B * 3 * H, pitchInBytes=W)
tdesc = texture.TextureDescriptor((runtime.cudaAddressModeClamp, runtime.cudaAddressModeClamp), runtime.cudaFilterModePoint,
                                  runtime.cudaReadModeElementType, normalizedCoords=0)
tex = texture.TextureObject(res, tdesc)
src = r'''
__device__ __forceinline__ float blend(float p00, float p01, float p10, float p11, float fx, float fy) {
  float v0 = __fadd_rn(p00, __fmul_rn(fx, __fsub_rn(p01, p00)));
  float v1 = __fadd_rn(p10, __fmul_rn(fx, __fsub_rn(p11, p10)));
  return __fadd_rn(v0, __fmul_rn(fy, __fsub_rn(v1, v0)));
}
__device__ __forceinline__ unsigned char store(float v) {
  float c = fminf(fmaxf(v, 0.f), 255.f); return (unsigned char)(__float_as_uint(__fadd_rn(c, 8388608.f)) & 0xFF);
}
#define COORDS \
  const int x = blockIdx.x * 16 + threadIdx.x % 16, y = blockIdx.y * 16 + threadIdx.x / 16, b = blockIdx.z; \
  if (x >= OW || y >= OH) return; \
  const double* m = M + b * 6; \
  const float sx = (float)__dadd_rn(__dmul_rn((double)(float)m[0], (double)x), (double)(float)__dadd_rn(__dmul_rn(m[1], (double)y), m[2])); \
  const float sy = (float)__dadd_rn(__dmul_rn((double)(float)m[3], (double)x), (double)(float)__dadd_rn(__dmul_rn(m[4], (double)y), m[5])); \
  const int ix = __float2int_rd(sx), iy = __float2int_rd(sy); \
  const float fx = sx - (float)ix, fy = sy - (float)iy; \
  const bool in = (unsigned)ix < (unsigned)(W - 1) && (unsigned)iy < (unsigned)(H - 1);
extern "C" __global__ void __launch_bounds__(256) tex_warp(unsigned long long tex, const double* M, unsigned char* out,
                                                            int H, int W, int OH, int OW, int order) {
  COORDS
  for (int c = 0; c < 3; ++c) {
    unsigned char r = 0;
    if (in) {
      const uchar4 g = tex2Dgather<uchar4>((cudaTextureObject_t)tex, ix + 1.0f, (b * 3 + c) * H + iy + 1.0f, 0);
      // documented order: x = (i0, j1), y = (i1, j1), z = (i1, j0), w = (i0, j0)
      float p00 = g.w, p01 = g.z, p10 = g.x, p11 = g.y;
      if (order) { p00 = g.x; p01 = g.y; p10 = g.z; p11 = g.w; }
      r = store(blend(p00, p01, p10, p11, fx, fy));
    }
    out[((size_t)(b * 3 + c) * OH + y) * OW + x] = r;
  }
}
extern "C" __global__ void __launch_bounds__(256) ldg_warp(const unsigned char* img, const double* M, unsigned char* out,
                                                            int H, int W, int OH, int OW, int order) {
  COORDS
  for (int c = 0; c < 3; ++c) {
    unsigned char r = 0;
    if (in) {
      const unsigned char* q = img + ((size_t)(b * 3 + c) * H + iy) * W + ix;
      r = store(blend(__ldg(q), __ldg(q + 1), __ldg(q + W), __ldg(q + W + 1), fx, fy));
    }
    out[((size_t)(b * 3 + c) * OH + y) * OW + x] = r;
  }
}
'''
mod = cp.RawModule(code=src, options=("--fmad=false",))
Mc = cp.asarray(inv.contiguous())
out = cp.zeros((B, 3, OH, OW), cp.uint8)
grid = ((OW + 15) // 16, (OH + 15) // 16, B)
refc = cp.asarray(ref)
inner = None
def run(name, first, order):
    mod.get_function(name)(grid, (256,), (first, Mc, out, np.int32(H), np.int32(W), np.int32(OH), np.int32(OW), np.int32(order)))
for name, first in (("tex_warp", np.uint64(tex.ptr)), ("ldg_warp", xc)):
    for order in (0, 1):
        out.fill(0); run(name, first, order); cp.cuda.Device().synchronize()
        nz = out != 0
        print(f"{name} order {order}: equal to orbbec on {float((out == refc)[nz].mean()) * 100:.4f}% of its nonzero values ({int(nz.sum())})")
    s, e = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(3): run(name, first, 0)
    ts = []
    for _ in range(5):
        run(name, first, 0); s.record()
        for _ in range(10): run(name, first, 0)
        e.record(); e.synchronize(); ts.append(cp.cuda.get_elapsed_time(s, e) / 10)
    print(f"{name}: {sorted(ts)[2] * 1e3:.1f} us per 32-image batch (median of 5 groups of 10)")
print(f"orbbec warp_affine NCHW (same 32 images): {cuda_time_ms(lambda: warp_affine(x, inv, (OW, OH), inverse_map=True), 50) * 1e3:.1f} us")
