// Arithmetic every op shares between its CPU and CUDA kernels, so that both devices compute the
// same bits: the host/device function macro, correctly rounded float and double operations, a
// finiteness test and the accumulator type. Include it from an op's src/common/<op>.h.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

// A function compiled for the host and, under nvcc, for the device. Always inlined: the kernels'
// per-pixel and per-box helpers are small and called from hot loops (out of line, the CPU warp
// paid a call and a returned struct per pixel).
#if defined(__CUDACC__)
#define ORBBEC_HD __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define ORBBEC_HD inline __attribute__((always_inline))
#else
#define ORBBEC_HD inline
#endif

namespace orbbec {

// Correctly rounded add, subtract, multiply and divide on both devices. nvcc would otherwise fuse
// a * b + c into an fma on the GPU (the build also passes --fmad=false), and host code is built
// with -ffp-contract=off, so each operation below is rounded on its own on either side.
#if defined(__CUDA_ARCH__)
ORBBEC_HD float add_rn(float a, float b) { return __fadd_rn(a, b); }
ORBBEC_HD float sub_rn(float a, float b) { return __fsub_rn(a, b); }
ORBBEC_HD float mul_rn(float a, float b) { return __fmul_rn(a, b); }
ORBBEC_HD float div_rn(float a, float b) { return __fdiv_rn(a, b); }
ORBBEC_HD double add_rn(double a, double b) { return __dadd_rn(a, b); }
ORBBEC_HD double sub_rn(double a, double b) { return __dsub_rn(a, b); }
ORBBEC_HD double mul_rn(double a, double b) { return __dmul_rn(a, b); }
ORBBEC_HD double div_rn(double a, double b) { return __ddiv_rn(a, b); }
#else
ORBBEC_HD float add_rn(float a, float b) { return a + b; }
ORBBEC_HD float sub_rn(float a, float b) { return a - b; }
ORBBEC_HD float mul_rn(float a, float b) { return a * b; }
ORBBEC_HD float div_rn(float a, float b) { return a / b; }
ORBBEC_HD double add_rn(double a, double b) { return a + b; }
ORBBEC_HD double sub_rn(double a, double b) { return a - b; }
ORBBEC_HD double mul_rn(double a, double b) { return a * b; }
ORBBEC_HD double div_rn(double a, double b) { return a / b; }
#endif

// false for NaN and +-inf, on either device.
template <typename T>
ORBBEC_HD bool is_finite(T v) {
#if defined(__CUDA_ARCH__)
  return ::isfinite(v);
#else
  return std::isfinite(v);
#endif
}

// The type the kernels compute in: double for double data, float for everything else (uint8,
// float16, bfloat16, float32). For the floating types this is at::opmath_type.
template <typename scalar_t>
using acc_type = typename std::conditional<std::is_same<scalar_t, double>::value, double, float>::type;

}  // namespace orbbec
