"""Fake kernels and autograd for the warp_affine ops (torch.library), so they work with
torch.compile, torch.export and opcheck, and are differentiable for floating images."""
from __future__ import annotations

import torch

from .. import _library  # noqa: F401  (loads orbbec._C, which defines the ops)
from .._layout import output_format
from ._matrices import invert_affine


@torch.library.register_fake("orbbec::warp_affine")
def _warp_affine_fake(src, M, out_h, out_w, interpolation, border_mode, border_value, invert_matrix=False):
    torch._check(src.dim() == 4, lambda: "orbbec: 'src' must be a 4-D tensor")
    torch._check(out_h > 0 and out_w > 0, lambda: "orbbec: output size must be positive")
    return src.new_empty((src.shape[0], src.shape[1], out_h, out_w)).contiguous(memory_format=output_format(src))


def _fused_output(batch, channels, out_h, out_w, out_dtype, channels_last, like):
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return like.new_empty((batch, channels, out_h, out_w), dtype=out_dtype).contiguous(memory_format=fmt)


@torch.library.register_fake("orbbec::warp_affine_fused")
def _warp_affine_fused_fake(src, M, out_h, out_w, interpolation, border_mode, border_value, out_dtype,
                            mean, std, scale, reverse_channels, channels_last_out, invert_matrix=False):
    return _fused_output(src.shape[0], src.shape[1], out_h, out_w, out_dtype, channels_last_out, src)


@torch.library.register_fake("orbbec::warp_affine_list")
def _warp_affine_list_fake(src, M, out_h, out_w, interpolation, border_mode, border_value, out_dtype,
                           mean, std, scale, reverse_channels, channels_last_out, invert_matrix=False):
    return _fused_output(len(src), src[0].shape[2], out_h, out_w, out_dtype, channels_last_out, src[0])


@torch.library.register_fake("orbbec::invert_affine")
def _invert_affine_fake(M):
    return torch.empty_like(M, memory_format=torch.contiguous_format)


@torch.library.register_fake("orbbec::warp_affine_backward")
def _warp_affine_backward_fake(grad_out, src, M, interpolation, border_mode, border_value,
                               need_src_grad, need_matrix_grad):
    grad_src = torch.empty_like(src).contiguous(memory_format=output_format(src))
    return grad_src, M.new_empty(M.shape)


def _setup_context(ctx, inputs, output):
    src, matrix, _out_h, _out_w, interpolation, border_mode, border_value, invert_matrix = inputs
    ctx.save_for_backward(src, matrix)
    ctx.modes = (interpolation, border_mode, border_value, invert_matrix)


def _backward(ctx, grad_out):
    src, matrix = ctx.saved_tensors
    interpolation, border_mode, border_value, invert_matrix = ctx.modes
    need_src, need_mat = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    none = (None,) * 6
    if not (need_src or need_mat):
        return (None, None) + none
    inv_matrix = matrix
    if invert_matrix:
        # The op inverted a forward matrix: the backward kernel takes the inverse map, inverted once
        # here, by invert_affine's differentiable formula when the matrix gradient goes through it
        # (the same bits as the op's inversion).
        with torch.enable_grad():
            forward = matrix.detach().requires_grad_(need_mat)
            inverted = invert_affine(forward)
        inv_matrix = inverted.detach()
    grad_src, grad_mat = torch.ops.orbbec.warp_affine_backward(
        grad_out, src, inv_matrix, interpolation, border_mode, border_value, need_src, need_mat)
    if need_mat and invert_matrix:  # chain rule through the inversion
        grad_mat, = torch.autograd.grad(inverted, forward, grad_mat.to(inverted.dtype))
    return (grad_src if need_src else None, grad_mat if need_mat else None) + none


torch.library.register_autograd("orbbec::warp_affine", _backward, setup_context=_setup_context)
