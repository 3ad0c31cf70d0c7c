"""RoIAlign (Mask R-CNN's region pooling) on the GPU or CPU, with torchvision.ops.roi_align's meaning.

Conventions (torchvision's): a box is (x1, y1, x2, y2) in image coordinates; ``spatial_scale`` maps
it onto the feature map (1/16 for a stride-16 map). With ``aligned=False`` (the legacy default) pixel
centres sit on integer coordinates and a box is made at least one pixel wide and high; with
``aligned=True`` boxes are shifted by -0.5 first, so that a box [0, 1] covers exactly pixel 0.
Each output bin averages ``sampling_ratio x sampling_ratio`` bilinear samples placed at the centres
of a regular grid in the bin (adaptive, ``ceil(box size / output size)`` per axis, when
``sampling_ratio <= 0``). A sample more than one pixel outside the map is 0; one within a pixel of
its edge reads the edge. ``pool_mode="max"`` takes the largest sample of each bin instead (mmcv).
"""
from __future__ import annotations

from typing import List, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from ..common import ArgumentError, ArgumentTypeError, call_op, check_not_quantized
from . import _ops  # noqa: F401  (registers fake kernels and autograd)

__all__ = ["roi_align", "RoIAlign"]

_POOL_MODES = {"avg": 0, "max": 1}
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

BoxesType = Union[Tensor, Sequence[Tensor]]


def _pair(output_size) -> Tuple[int, int]:
    if isinstance(output_size, int) and not isinstance(output_size, bool):
        size = (output_size, output_size)
    elif isinstance(output_size, (tuple, list, torch.Size)) and len(output_size) == 2:
        size = tuple(output_size)
    else:
        raise ArgumentError(f"orbbec: 'output_size' must be an int or a pair (h, w) of ints, got {output_size!r}")
    if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in size):
        raise ArgumentError(f"orbbec: 'output_size' must be positive ints, got {output_size!r}")
    return size


def _rois_tensor(boxes: BoxesType, input: Tensor) -> Tensor:
    """[K, 5] rois (batch index, x1, y1, x2, y2) from a [K, 5] tensor or a list of [L_i, 4] boxes."""
    if isinstance(boxes, Tensor):
        if boxes.dim() != 2 or boxes.shape[1] != 5:
            raise ArgumentError(f"orbbec: 'boxes' as a tensor must have shape [K, 5] (batch index, x1, y1, x2, y2), "
                             f"got {tuple(boxes.shape)}")
        rois = boxes
    elif isinstance(boxes, (list, tuple)):
        for i, b in enumerate(boxes):
            if not isinstance(b, Tensor) or b.dim() != 2 or b.shape[1] != 4:
                shape = tuple(b.shape) if isinstance(b, Tensor) else type(b).__name__
                raise ArgumentError(f"orbbec: 'boxes[{i}]' must be a tensor of shape [L, 4] (x1, y1, x2, y2), got {shape}")
        if len(boxes) == 0:
            return input.new_zeros((0, 5))
        dtypes = {b.dtype for b in boxes}
        devices = {b.device for b in boxes}
        if len(dtypes) > 1 or len(devices) > 1:
            raise ArgumentError("orbbec: the tensors of 'boxes' must share one dtype and one device")
        ids = torch.cat([torch.full((b.shape[0], 1), i, dtype=b.dtype, device=b.device) for i, b in enumerate(boxes)])
        rois = torch.cat([ids, torch.cat(list(boxes))], dim=1)
    else:
        raise ArgumentTypeError(f"orbbec: 'boxes' must be a Tensor[K, 5] or a list of Tensor[L, 4], got {type(boxes).__name__}")
    if rois.dtype != input.dtype and not _autocasting(input):
        raise ArgumentTypeError(f"orbbec: 'boxes' must have the dtype of 'input' ({input.dtype}), got {rois.dtype} "
                                f"(mixed dtypes are taken under torch.autocast)")
    if rois.device != input.device:
        raise ArgumentError(f"orbbec: 'boxes' must be on the device of 'input' ({input.device}), got {rois.device}")
    return rois


def _autocasting(input: Tensor) -> bool:
    return torch.is_autocast_enabled(input.device.type)


def _autocast_float32(t: Tensor) -> Tensor:
    # torchvision's autocast kernel (at::autocast::cached_cast to float): float16 / bfloat16 are
    # computed in float32; float64 stays float64.
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


# torch.fx.wrap: symbolic_trace records roi_align as one call instead of tracing into its checks
# (which need real tensors), as torchvision does for its roi_align.
@torch.fx.wrap
def roi_align(
    input: Tensor,
    boxes: BoxesType,
    output_size: Union[int, Tuple[int, int]],
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
    pool_mode: str = "avg",
) -> Tensor:
    """Pools a fixed-size feature for each box, as torchvision.ops.roi_align (module docstring).

    Args:
        input: feature maps [N, C, H, W], float16, bfloat16, float32 or float64, NCHW or
            channels_last (the output takes the input's memory format).
        boxes: Tensor[K, 5] of (batch index, x1, y1, x2, y2), or a list of N Tensor[L_i, 4] of
            (x1, y1, x2, y2), the boxes of image i. Same dtype and device as ``input``.
        output_size: (height, width) of each pooled feature, or one int for both.
        spatial_scale: multiplies the box coordinates to give feature-map coordinates.
        sampling_ratio: samples per bin along each axis; <= 0: ceil(box size / output size).
        aligned: shift boxes by -0.5 pixel (see the module docstring); recommended for new models.
        pool_mode: "avg" (torchvision) or "max" (mmcv's: the largest sample of each bin; 0 for a bin
            without samples).

    Returns:
        Tensor [K, C, output_h, output_w]. Arithmetic is float32 (float64 for float64 inputs).
        Under autocast (torch.autocast on the input's device) ``input`` and ``boxes`` may differ in
        dtype: float16 / bfloat16 ones are computed in float32, as torchvision's autocast kernel
        does, and the output has the input's dtype. Quantized tensors are not supported.
        A box whose batch index is not in [0, N) raises ValueError on the CPU; on CUDA (which
        cannot check without waiting for the GPU) it pools zeros and gets no gradient.
        Gradients flow to ``input``; under ``torch.use_deterministic_algorithms(True)`` the CUDA
        backward is bitwise reproducible.
    """
    if isinstance(input, torch.fx.Proxy):
        # Traced through a name torch.fx.wrap did not patch (imported into another module): record
        # the call as one node all the same.
        return input.tracer.create_proxy("call_function", _ROI_ALIGN, (input, boxes, output_size, spatial_scale,
                                                                       sampling_ratio, aligned, pool_mode), {})
    if not isinstance(input, Tensor):
        raise ArgumentTypeError(f"orbbec: 'input' must be a torch.Tensor, got {type(input).__name__}")
    check_not_quantized(input, "input", "orbbec.roi_align")
    if input.dim() != 4:
        raise ArgumentError(f"orbbec: 'input' must be [N, C, H, W], got shape {tuple(input.shape)}")
    if input.dtype not in _DTYPES:
        raise ArgumentTypeError(f"orbbec: 'input' must be float16, bfloat16, float32 or float64, got {input.dtype}")
    if pool_mode not in _POOL_MODES:
        raise ArgumentError(f"orbbec: 'pool_mode' must be 'avg' or 'max', got {pool_mode!r}")
    if not isinstance(sampling_ratio, int) or isinstance(sampling_ratio, bool):
        raise ArgumentTypeError(f"orbbec: 'sampling_ratio' must be an int, got {sampling_ratio!r}")
    out_h, out_w = _pair(output_size)
    rois = _rois_tensor(boxes, input)
    args = (float(spatial_scale), out_h, out_w, sampling_ratio, bool(aligned), _POOL_MODES[pool_mode])
    if _autocasting(input):
        out = call_op(torch.ops.orbbec.roi_align, _autocast_float32(input), _autocast_float32(rois), *args)
        return out.to(input.dtype)
    return call_op(torch.ops.orbbec.roi_align, input, rois, *args)


_ROI_ALIGN = roi_align  # the function itself: while tracing, the name roi_align is fx.wrap's patch


class RoIAlign(nn.Module):
    """Module form of :func:`roi_align`, with torchvision.ops.RoIAlign's signature plus pool_mode."""

    def __init__(self, output_size: Union[int, Tuple[int, int]], spatial_scale: float, sampling_ratio: int,
                 aligned: bool = False, pool_mode: str = "avg"):
        super().__init__()
        self.output_size = _pair(output_size)
        if pool_mode not in _POOL_MODES:
            raise ArgumentError(f"orbbec: 'pool_mode' must be 'avg' or 'max', got {pool_mode!r}")
        self.spatial_scale = spatial_scale
        self.sampling_ratio = sampling_ratio
        self.aligned = aligned
        self.pool_mode = pool_mode

    def forward(self, input: Tensor, rois: Union[Tensor, List[Tensor]]) -> Tensor:
        return roi_align(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio, self.aligned,
                         self.pool_mode)

    def extra_repr(self) -> str:
        return (f"output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
                f"sampling_ratio={self.sampling_ratio}, aligned={self.aligned}, pool_mode={self.pool_mode!r}")
