// Forward warp kernels for at::Half input (see warpaffine_forward.cuh).
#include "warpaffine/src/cuda/warpaffine_forward.cuh"

ORBBEC_WARP_FORWARD_INSTANTIATE(at::Half)
