"""orbbec: data augmentation on the GPU for PyTorch training loops.

Ops (each in its own subpackage, registered as torch.ops.orbbec.*):
  orbbec.io          decode_jpeg: batched JPEG decoding on the GPU (nvJPEG) or the CPU (OpenCV)
  orbbec.augment     per-sample random geometric augmentation as one matrix per sample, boxes, keypoints
  orbbec.warpaffine  warp_affine / affine_torch, matrix helpers, align_faces, affine_opencv
  orbbec.nms         nms, batched_nms, soft_nms
  orbbec.roi_align   roi_align, RoIAlign
Every op runs on CPU and, when built with CUDA, on the GPU of its inputs.
"""
# Before anything else initializes CUDA: the decoder's streams need their own work queues.
from .common import cuda_connections as _cuda_connections

_cuda_connections.widen()

from ._library import get_compiler_version, get_compiling_cuda_version, with_cuda  # noqa: F401  (loads _C)
from .common import ArgumentError, ArgumentTypeError  # noqa: F401

from . import augment, io, nms, roi_align, warpaffine  # noqa: E402,F401

__version__ = "0.1.0"
__all__ = ["ArgumentError", "ArgumentTypeError", "augment", "io", "warpaffine", "nms", "roi_align", "get_compiler_version", "get_compiling_cuda_version", "with_cuda"]
