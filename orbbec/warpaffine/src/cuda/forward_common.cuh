// What the forward warp kernels share: the kernel parameters, the output layout of a thread
// block, and the tap loads and border-aware samplers. The arithmetic is the shared code of
// common/warpaffine.h, so CPU and CUDA agree bit for bit.
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "common/src/cuda_utils.cuh"
#include "warpaffine/src/warpaffine_ext.h"

namespace orbbec {
namespace warpaffine {
namespace forward_cuda {

constexpr int kThreads = 256;

// Forward thread layout. A warp covers 32 x 4 output pixels as kPx = 4 patches of 8 x 4; thread
// (lx, ly) of the warp computes pixel (lx + 8k, ly) of patch k, all channels. One load
// instruction of the warp thus gathers the taps of a compact 8 x 4 patch, which under any
// rotation fall in a few input rows (sectors); with each thread taking 4 consecutive pixels
// instead, one instruction spanned 32 x 4 pixels and touched several times more sectors. Stores
// of a patch row are 8 consecutive elements, which the memory system merges. A block of 8 warps
// covers a 32 x 32 output tile; blocks of one image are neighbours in the grid, so the input they
// share stays in L2.
constexpr int kPx = 4, kPatchW = 8, kPatchH = 32 / kPatchW;
constexpr int kTileW = kPatchW * kPx, kTileH = kPatchH * (kThreads / 32);

// One input image: contiguous NCHW (planes of H x W) or NHWC (rows of W x C).
struct ImageDesc {
  const unsigned char* data;
  int64_t H, W;
};

// The op's matrices as it received them: float32 or float64 with any strides (an expanded [2, 3]
// has batch stride 0), either the inverse maps themselves or forward matrices to invert.
// prepare_matrices turns them into the kernels' contiguous float64 inverse maps.
struct MatrixArg {
  const void* data;
  int64_t sb, sr, sc;  // element strides of batch, row and column
  bool is_double;
  bool invert;  // maps source to destination: invert with invert_affine_2x3 (the invert_affine op's arithmetic)
};

struct ForwardParams {
  const ImageDesc* images;    // a list input: one per image, in device memory; nullptr for a batch
  const unsigned char* base;  // a batch tensor: image b starts at base + b * image_bytes
  int64_t image_bytes;
  int64_t B, C, H, W, OH, OW;
  bool in_channels_last, out_channels_last;
  int64_t interp, border;
  BorderValues border_values;
  OutputTransform transform;  // the fused output (off for a plain warp)
  float c3_border[3];  // the 3-channel uint8 kernel's border values per output channel (launch_c3 sets them)
  const double* matrices;  // [B, 6] inverse maps (output pixel -> input position), contiguous; read with __ldg
};

// Read-only loads through the non-coherent cache where the type has an __ldg overload.
template <typename T>
__device__ __forceinline__ T ro_load(const T* p) { return *p; }
template <>
__device__ __forceinline__ uint8_t ro_load(const uint8_t* p) { return __ldg(p); }
template <>
__device__ __forceinline__ float ro_load(const float* p) { return __ldg(p); }
template <>
__device__ __forceinline__ double ro_load(const double* p) { return __ldg(p); }

// An image value as the accumulator type. uint8 on the GPU goes through the float 2^23 + b bit
// trick (exact): the integer-to-float unit runs at a quarter of the FP32 rate, and every output
// pixel converts 4 taps per channel.
template <typename acc_t, typename in_t>
__device__ __forceinline__ acc_t load_acc(const in_t* p) { return static_cast<acc_t>(ro_load(p)); }
template <>
__device__ __forceinline__ float load_acc<float, uint8_t>(const uint8_t* p) {
  return __fsub_rn(__uint_as_float(0x4B000000u | __ldg(p)), 8388608.0f);
}

// Channel c's constant border value as the image type holds it (cv2 saturates it), in acc_t. On
// the host too: launch_c3 converts its border values once (Store rounds alike on both sides).
template <typename acc_t, typename in_t>
__host__ __device__ __forceinline__ acc_t border_value(const BorderValues& values, int64_t c) {
  return static_cast<acc_t>(Store<in_t, double>::cast(values[c]));
}

// A bilinear pixel whose taps q, q + dx, q + dy, q + dy + dx all lie in the image.
template <typename in_t, typename acc_t>
__device__ __forceinline__ acc_t bilinear_inner(const in_t* q, int dx, int dy, acc_t fx, acc_t fy) {
  return blend_bilinear(load_acc<acc_t>(q), load_acc<acc_t>(q + dx), load_acc<acc_t>(q + dy),
                        load_acc<acc_t>(q + dy + dx), fx, fy);
}

// Pixels with a tap outside the image: the shared header's sampler. It recomputes the pixel's taps
// from the matrix, so the kernel keeps only what the inner path needs in registers.
// Bilinear and nearest with a template-constant interpolation are inlined in 32-bit indices (a
// call costs the whole kernel registers: 128 with it, 54 without; the host checks each image
// holds fewer than 2^31 elements and sides of at most 2^30). Bicubic and the runtime
// interpolation of non-uint8 images go out of line in 64 bits: inlined, their arithmetic raised
// the kernel's registers for every pixel.
// M is the image's inverse map (ForwardParams::matrices).
template <typename acc_t>
__device__ __forceinline__ Taps<acc_t> taps_from_matrix(const double* M, double x, double y, int64_t interp) {
  return make_taps(source_coord(__ldg(M), row_term(__ldg(M + 1), __ldg(M + 2), y), x, acc_t()),
                   source_coord(__ldg(M + 3), row_term(__ldg(M + 4), __ldg(M + 5), y), x, acc_t()), interp);
}
// One channel plane's value at taps t, border-aware, in 32-bit indices.
template <typename in_t, typename acc_t>
__device__ __forceinline__ acc_t sample_plane(const Taps<acc_t>& t, const in_t* plane, int sx, int sy, int H, int W,
                                              int64_t border, acc_t bval) {
  auto fetch = [&](int ix, int iy) -> acc_t { return load_acc<acc_t>(plane + iy * sy + ix * sx); };
  return sample<int>(t, H, W, border, bval, fetch);
}
template <int kInterp, typename in_t, typename acc_t>
__device__ __forceinline__ acc_t sample_edge(const double* M, int x, int y, const in_t* plane, int sx, int sy,
                                             int H, int W, int64_t border, acc_t bval) {
  return sample_plane(taps_from_matrix<acc_t>(M, x, y, kInterp), plane, sx, sy, H, W, border, bval);
}
template <typename in_t, typename acc_t>
__device__ __noinline__ acc_t sample_general(const double* M, int64_t x, int64_t y, int64_t interp,
                                             const in_t* plane, int64_t sx, int64_t sy, int64_t H, int64_t W,
                                             int64_t border, acc_t bval) {
  const Taps<acc_t> t = taps_from_matrix<acc_t>(M, static_cast<double>(x), static_cast<double>(y), interp);
  auto fetch = [&](int64_t ix, int64_t iy) -> acc_t { return static_cast<acc_t>(ro_load(plane + iy * sy + ix * sx)); };
  return sample<int64_t>(t, H, W, border, bval, fetch);
}

}  // namespace forward_cuda
}  // namespace warpaffine
}  // namespace orbbec
