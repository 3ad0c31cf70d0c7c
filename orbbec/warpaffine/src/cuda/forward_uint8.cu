// Forward warp kernels for uint8_t input (see warpaffine_forward.cuh).
#include "warpaffine/src/cuda/warpaffine_forward.cuh"

ORBBEC_WARP_FORWARD_INSTANTIATE(uint8_t)
