"""Fake kernels and autograd for the roi_align ops (torch.library), so they work with torch.compile,
torch.export and opcheck, and are differentiable with respect to the feature map."""
from __future__ import annotations

import torch

from .. import _library  # noqa: F401  (loads orbbec._C, which defines the ops)
from .._layout import output_format


@torch.library.register_fake("orbbec::roi_align")
def _roi_align_fake(input, boxes, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned, pool_mode):
    torch._check(input.dim() == 4, lambda: "orbbec: 'input' must be a 4-D tensor")
    torch._check(boxes.dim() == 2 and boxes.shape[1] == 5, lambda: "orbbec: 'boxes' must have shape [K, 5]")
    torch._check(pooled_height > 0 and pooled_width > 0, lambda: "orbbec: 'output_size' must be positive")
    return torch.empty((boxes.shape[0], input.shape[1], pooled_height, pooled_width), dtype=input.dtype,
                       device=input.device, memory_format=output_format(input))


@torch.library.register_fake("orbbec::roi_align_backward")
def _roi_align_backward_fake(grad, boxes, input, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned,
                             pool_mode, deterministic):
    return torch.empty(input.shape, dtype=input.dtype, device=input.device, memory_format=output_format(input))


def _setup_context(ctx, inputs, output):
    input, rois, *params = inputs
    # The input gives the gradient's shape and memory format, and in max mode the values that
    # decide which sample of each bin gets the gradient.
    ctx.save_for_backward(input, rois)
    ctx.params = params


def _backward(ctx, grad):
    if not ctx.needs_input_grad[0]:
        return (None,) * 8
    input, rois = ctx.saved_tensors
    # The deterministic CUDA kernel is chosen here, under torch.use_deterministic_algorithms(True).
    deterministic = torch.are_deterministic_algorithms_enabled()
    grad_input = torch.ops.orbbec.roi_align_backward(grad, rois, input, *ctx.params, deterministic)
    return (grad_input,) + (None,) * 7


torch.library.register_autograd("orbbec::roi_align", _backward, setup_context=_setup_context)
