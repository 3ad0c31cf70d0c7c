// Forward warp kernels for float input (see warpaffine_forward.cuh).
#include "warpaffine/src/cuda/warpaffine_forward.cuh"

ORBBEC_WARP_FORWARD_INSTANTIATE(float)
