// Forward warp kernels for double input (see warpaffine_forward.cuh).
#include "warpaffine/src/cuda/warpaffine_forward.cuh"

ORBBEC_WARP_FORWARD_INSTANTIATE(double)
