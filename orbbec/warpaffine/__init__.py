"""Affine warps of image batches on the GPU (or CPU), with cv2.warpAffine's meaning and pixels.

Conventions (OpenCV's): pixel centres are at integer coordinates; a matrix M maps source to
destination, ``dst(x, y) = src(M^-1 (x, y))``, unless it is an inverse map, which maps each output
pixel to the input position it samples. Border modes and interpolations are cv2's.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from .._layout import is_channels_last
from . import _ops  # noqa: F401  (registers fake kernels and autograd)
from ._matrices import (  # noqa: F401
    ARCFACE_TEMPLATE_112,
    arcface_template,
    estimate_affine,
    estimate_similarity,
    get_affine_transform,
    invert_affine,
)
from ._opencv_api import affine_opencv  # noqa: F401
from ..common import ArgumentError, ArgumentTypeError

__all__ = [
    "warp_affine", "affine_torch", "align_faces", "affine_opencv", "get_affine_transform",
    "estimate_affine", "estimate_similarity", "invert_affine", "arcface_template",
]

# Names and cv2's own integer codes (cv2.INTER_*, cv2.BORDER_*), which the ops take unchanged.
_INTERPOLATIONS = {"nearest": 0, "bilinear": 1, "linear": 1, "bicubic": 2, "cubic": 2}
_BORDERS = {"constant": 0, "replicate": 1, "reflect": 2, "wrap": 3, "reflect101": 4, "reflect_101": 4}
_CV2_INTERPOLATIONS = frozenset(_INTERPOLATIONS.values())
_CV2_BORDERS = frozenset(_BORDERS.values())
_DTYPES = (torch.uint8, torch.float16, torch.bfloat16, torch.float32, torch.float64)


# Exact str and int keys straight to their codes (the common call); anything else (another case,
# an int subclass such as an IntEnum) takes _mode_code's full rules. A bool or a float never
# reaches the table, whose int keys it would hash equal to.
_INTERP_CODES = {**_INTERPOLATIONS, **{c: c for c in _CV2_INTERPOLATIONS}}
_BORDER_CODES = {**_BORDERS, **{c: c for c in _CV2_BORDERS}}


def _mode_code(value, names: dict, cv2_codes: frozenset, codes: dict, arg: str) -> int:
    if type(value) is str or type(value) is int:  # the common call: one lookup
        code = codes.get(value)
        if code is not None:
            return code
    if isinstance(value, str) and value.lower() in names:
        return names[value.lower()]
    if isinstance(value, int) and not isinstance(value, bool) and value in cv2_codes:
        return int(value)
    raise ArgumentError(f"orbbec: '{arg}' must be one of {sorted(names)} (or a cv2 constant), got {value!r}")


# Channel counts of images: a 4-D batch whose last axis is one of these and whose "channel" axis is
# larger is most likely [B, H, W, C] (what decoders and numpy give), which read as NCHW would warp
# garbage without any error.
_IMAGE_CHANNELS = (1, 3, 4)
_MAX_IMAGE_CHANNELS = max(_IMAGE_CHANNELS)
_MAX_FUSED_CHANNELS = 64  # kMaxBorderChannels of the C++ op


def _tensor_layout(src: torch.Tensor, input_layout: Optional[str]) -> torch.Tensor:
    """src as [B, C, H, W] (or [C, H, W]) by input_layout: None (NCHW, guarded), "NCHW" or "NHWC"."""
    if input_layout == "NHWC":
        return src.movedim(-1, -3) if src.dim() >= 3 else src
    if input_layout not in (None, "NCHW"):
        raise ArgumentError(f"orbbec: 'input_layout' of a tensor 'src' must be 'NCHW' or 'NHWC', got {input_layout!r}")
    shape = src.shape
    if input_layout is None and len(shape) in (3, 4) and shape[-1] in _IMAGE_CHANNELS \
            and shape[-3] > _MAX_IMAGE_CHANNELS:
        raise ArgumentError(
            f"orbbec: 'src' of shape {tuple(src.shape)} looks channels-last ([B, H, W, C] with C = {src.shape[-1]}) "
            f"but is read as [B, C, H, W] with C = {src.shape[-3]}: pass input_layout='NHWC' to read it as "
            f"[B, H, W, C] (or src.permute(0, 3, 1, 2)), or input_layout='NCHW' if it really has "
            f"{src.shape[-3]} channels")
    return src


def _check_src(src) -> Tuple[torch.Tensor, bool]:
    if not isinstance(src, torch.Tensor):
        raise ArgumentTypeError(f"orbbec: 'src' must be a torch.Tensor, got {type(src).__name__}")
    shape = src.shape  # read once: every .shape builds a new torch.Size
    if len(shape) not in (3, 4):
        raise ArgumentError(f"orbbec: 'src' must be [B, C, H, W] or [C, H, W], got shape {tuple(shape)}")
    if src.dtype not in _DTYPES:
        raise ArgumentTypeError(f"orbbec: 'src' must be uint8, float16, bfloat16, float32 or float64, got {src.dtype}")
    batched = len(shape) == 4
    B, C, H, W = shape if batched else (1, *shape)
    if C == 0:
        raise ArgumentError(f"orbbec: 'src' must have at least one channel, got shape {tuple(shape)}")
    if B > 0 and (H == 0 or W == 0):
        raise ArgumentError(f"orbbec: 'src' must have a non-empty height and width, got shape {tuple(shape)}")
    return (src if batched else src.unsqueeze(0)), batched


def _check_matrix(M, src4: torch.Tensor, arg: str = "M") -> torch.Tensor:
    if not isinstance(M, torch.Tensor):
        try:
            M = torch.as_tensor(M, dtype=torch.float64, device=src4.device)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ArgumentTypeError(f"orbbec: '{arg}' must be a tensor or array of shape [B, 2, 3] or [2, 3]") from exc
    if M.dtype not in (torch.float32, torch.float64):
        raise ArgumentTypeError(f"orbbec: '{arg}' must be float32 or float64, got {M.dtype}")
    if M.device != src4.device:
        raise ArgumentError(f"orbbec: '{arg}' must be on the device of 'src' ({src4.device}), got {M.device}")
    shape, batch = M.shape, src4.shape[0]
    if shape == (2, 3):
        # a view with batch stride 0: the ops read the matrices through their strides, no copy
        return M.expand(batch, 2, 3)
    if len(shape) != 3 or shape[1:] != (2, 3) or shape[0] != batch:
        raise ArgumentError(f"orbbec: '{arg}' must have shape [B, 2, 3] with B = {batch} (the batch of "
                         f"'src') or [2, 3], got {tuple(shape)}")
    return M


def _output_size(dsize, size) -> Tuple[int, int]:
    """(width, height) from cv2's dsize=(width, height) or size=(height, width): exactly one."""
    if (dsize is None) == (size is None):
        raise ArgumentError("orbbec: give the output size once: dsize=(width, height) as cv2, or "
                            "size=(height, width) as torch" + (", not both" if size is not None else ""))
    name, order = ("dsize", "(width, height)") if size is None else ("size", "(height, width)")
    value = dsize if size is None else ((size, size) if isinstance(size, int) else size)
    try:
        a, b = (int(v) for v in value)
    except (TypeError, ValueError) as exc:
        raise ArgumentError(f"orbbec: '{name}' must be {order}, got {value!r}") from exc
    if a <= 0 or b <= 0:
        raise ArgumentError(f"orbbec: '{name}' must be positive {order}, got {value!r}")
    return (a, b) if size is None else (b, a)


def _border_values(border_value, channels: int) -> list:
    if isinstance(border_value, (int, float)) and not isinstance(border_value, bool):
        return [float(border_value)]
    try:
        values = [float(v) for v in border_value]
    except (TypeError, ValueError) as exc:
        raise ArgumentTypeError(f"orbbec: 'border_value' must be a number or a sequence of numbers, got {border_value!r}") from exc
    if len(values) == 4 and channels < 4:  # cv2.Scalar style (b, g, r, a)
        values = values[:channels]
    if len(values) not in (1, channels):
        raise ArgumentError(f"orbbec: 'border_value' must hold 1 value or {channels} (one per channel), got {len(values)}")
    return values


_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.uint8)


def _check_image_list(images, input_layout: Optional[str]):
    input_layout = "HWC" if input_layout is None else input_layout
    if input_layout not in ("HWC", "CHW"):
        raise ArgumentError(f"orbbec: 'input_layout' of a list 'src' must be 'HWC' or 'CHW', got {input_layout!r}")
    if len(images) == 0:
        raise ArgumentError("orbbec: 'src' must hold at least one image")
    hwc = []
    for i, im in enumerate(images):
        if not isinstance(im, torch.Tensor) or im.dim() != 3:
            raise ArgumentError(f"orbbec: 'src[{i}]' must be a 3-D {input_layout} tensor")
        if im.dtype not in _DTYPES:
            raise ArgumentTypeError(f"orbbec: 'src[{i}]' must be uint8, float16, bfloat16, float32 or float64, got {im.dtype}")
        hwc.append(im if input_layout == "HWC" else im.permute(1, 2, 0))
    channels = hwc[0].shape[2]
    if channels > _MAX_FUSED_CHANNELS or (input_layout == "HWC" and channels > max(_IMAGE_CHANNELS)
                                          and hwc[0].shape[0] in _IMAGE_CHANNELS):
        other = "CHW" if input_layout == "HWC" else "HWC"
        raise ArgumentError(
            f"orbbec: 'src[0]' of shape {tuple(images[0].shape)} read with input_layout='{input_layout}' has "
            f"{channels} channels (the fused output supports up to {_MAX_FUSED_CHANNELS}, images have 1, 3 or 4): "
            f"pass input_layout='{other}' if the images are {other}")
    return hwc


def warp_affine(
    src: Union[torch.Tensor, Sequence[torch.Tensor]],
    M: torch.Tensor,
    dsize: Optional[Tuple[int, int]] = None,
    *,
    size: Optional[Union[int, Tuple[int, int]]] = None,
    interpolation: Union[str, int] = "bilinear",
    border_mode: Union[str, int] = "constant",
    border_value: Union[float, Sequence[float]] = 0,
    inverse_map: bool = False,
    out_dtype: Optional[torch.dtype] = None,
    mean: Optional[Sequence[float]] = None,
    std: Optional[Sequence[float]] = None,
    scale: float = 1.0,
    reverse_channels: bool = False,
    out_layout: Optional[str] = None,
    input_layout: Optional[str] = None,
) -> torch.Tensor:
    """cv2.warpAffine for a batch: ``out[b] = cv2.warpAffine(src[b], M[b], dsize, ...)``.

    Args:
        src: [B, C, H, W] or [C, H, W]; uint8, float16, bfloat16, float32 or float64; any channel
            count; NCHW or channels_last (the output keeps channels_last), on CPU or CUDA; a tensor
            [B, H, W, C] with ``input_layout="NHWC"`` (read as the channels_last NCHW view). Or a
            list of B images of different sizes, HWC as decoders return them
            (``input_layout="CHW"`` for [C, H, W] ones), warped in one launch. A tensor whose last
            axis is 1, 3 or 4 and whose channel axis is larger raises (it looks channels-last)
            unless ``input_layout`` says which it is.
        M: [B, 2, 3] (one matrix per image) or [2, 3] (shared), float32 or float64, on src's device.
            It maps source to destination pixels unless ``inverse_map``; it is inverted in float64
            as cv2 does.
        dsize: output size as (width, height), as in cv2. Or, by keyword instead:
        size: output size as (height, width), as torch (F.interpolate) and kornia's ``dsize`` give it;
            one int for a square.
        interpolation: "nearest", "bilinear" or "bicubic" (or cv2.INTER_*).
        border_mode: "constant", "replicate", "reflect", "reflect101" or "wrap" (or cv2.BORDER_*).
        border_value: constant border value, one number or one per channel.
        inverse_map: M maps each output pixel to the input position it samples
            (cv2.WARP_INVERSE_MAP).
        out_dtype, mean, std, scale, reverse_channels, out_layout: the fused output, computed in the
            same pass: ``out[c] = (v[c'] * scale - mean[c]) / std[c]`` where v is the sampled value
            (not rounded to the image type) and c' = C-1-c with ``reverse_channels`` (BGR <-> RGB);
            written as ``out_dtype`` (float32, float16, bfloat16 or uint8) in ``out_layout`` "NCHW"
            or "NHWC" (an NCHW-shaped tensor in channels_last memory). Not differentiable: a src
            that requires grad (with grad mode on) raises.

    Returns [B, C, height, width] (or [C, height, width]) of src's dtype unless ``out_dtype``; uint8
    rounds half to even and saturates. Pixels whose source position is not finite (or further
    than 2^30 from the image) get the constant border value whatever the border mode. The plain
    warp is differentiable in src and M for floating images.
    """
    is_list = isinstance(src, (list, tuple))
    if isinstance(src, torch.Tensor):
        src = _tensor_layout(src, input_layout)
    if is_list:
        images = _check_image_list(src, input_layout)
        probe = images[0].permute(2, 0, 1).unsqueeze(0)
        batch = len(images)
        M = _check_matrix(M, probe.expand(batch, *probe.shape[1:]))
        channels, dtype, batched = probe.shape[1], probe.dtype, True
    else:
        src4, batched = _check_src(src)
        M = _check_matrix(M, src4)
        channels, dtype = src4.shape[1], src4.dtype
    out_w, out_h = _output_size(dsize, size)
    interp = _mode_code(interpolation, _INTERPOLATIONS, _CV2_INTERPOLATIONS, _INTERP_CODES, "interpolation")
    border = _mode_code(border_mode, _BORDERS, _CV2_BORDERS, _BORDER_CODES, "border_mode")
    values = _border_values(border_value, channels)
    grad = torch.is_grad_enabled() and (M.requires_grad or (not is_list and src4.requires_grad))
    # The ops invert a forward matrix themselves (invert_matrix; on CUDA one small kernel launched
    # from C++, with invert_affine's arithmetic, so the same bits), sparing the Python dispatches and
    # the float64 conversion or copy of M per call. A matrix that needs a gradient is inverted here by
    # invert_affine's differentiable formula.
    invert = not inverse_map
    if invert and grad and M.requires_grad:
        M, invert = invert_affine(M), False
    fused = is_list or out_dtype is not None or mean is not None or std is not None or scale != 1.0 \
        or reverse_channels or out_layout is not None
    if not fused:
        if grad or dtype == torch.float64 or channels > _MAX_FUSED_CHANNELS:
            out = torch.ops.orbbec.warp_affine(src4, M, out_h, out_w, interp, border, values, invert)
        else:
            # Without autograd the plain warp is the fused op with the identity output transform (the
            # same kernels, the same bits), which skips the plain op's Python autograd kernel: about a
            # quarter of a small call's host time.
            out = torch.ops.orbbec.warp_affine_fused(src4, M, out_h, out_w, interp, border, values, dtype, [], [],
                                                     1.0, False, is_channels_last(src4), invert)
        return out if batched else out.squeeze(0)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (images if is_list else [src4])):
        raise ArgumentError(
            "orbbec: the fused warp (out_dtype, mean, std, scale, reverse_channels, out_layout, or a list of "
            "images) is not differentiable, but 'src' requires grad: warp with the plain call and normalise "
            "with torch ops to train through it, or pass src.detach()")
    if channels > _MAX_FUSED_CHANNELS:
        raise ArgumentError(f"orbbec: the fused output supports up to {_MAX_FUSED_CHANNELS} channels, got {channels}")
    out_dtype, mean_list, std_list = _output_transform(channels, dtype if out_dtype is None else out_dtype, mean, std)
    if out_layout is None:
        channels_last = (not is_list) and is_channels_last(src4)
    elif out_layout in ("NCHW", "NHWC"):
        channels_last = out_layout == "NHWC"
    else:
        raise ArgumentError(f"orbbec: 'out_layout' must be 'NCHW' or 'NHWC', got {out_layout!r}")
    args = (M, out_h, out_w, interp, border, values, out_dtype, mean_list, std_list, float(scale),
            bool(reverse_channels), channels_last, invert)
    if is_list:
        return torch.ops.orbbec.warp_affine_list(images, *args)
    out = torch.ops.orbbec.warp_affine_fused(src4, *args)
    return out if batched else out.squeeze(0)


def _output_transform(channels: int, out_dtype: torch.dtype, mean, std) -> tuple:
    """The fused output's dtype, mean and std lists, checked."""
    if out_dtype not in _OUT_DTYPES:
        raise ArgumentTypeError(f"orbbec: 'out_dtype' must be float32, float16, bfloat16 or uint8, got {out_dtype}")
    std_list = _per_channel(std, channels, "std")
    if any(v == 0 for v in std_list):
        raise ArgumentError("orbbec: 'std' must be non-zero")
    return out_dtype, _per_channel(mean, channels, "mean"), std_list


def _per_channel(values, channels: int, name: str) -> list:
    if values is None:
        return []
    if isinstance(values, torch.Tensor):
        values = values.flatten().tolist()
    if isinstance(values, (int, float)):
        return [float(values)]
    values = [float(v) for v in values]
    if len(values) not in (1, channels):
        raise ArgumentError(f"orbbec: '{name}' must hold 1 value or {channels} (one per channel), got {len(values)}")
    return values


def affine_torch(input: torch.Tensor, affine_matrix: torch.Tensor, out_h: int, out_w: int) -> torch.Tensor:
    """The inverse-map warp: input [B, C, H, W] (or [C, H, W]), affine_matrix [B, 2, 3] (or
    [2, 3]) mapping each OUTPUT pixel (x, y) to the INPUT position it samples; bilinear, constant 0
    border, integer pixel centres. Equal to ``warp_affine(input, affine_matrix, (out_w, out_h),
    inverse_map=True)``."""
    return warp_affine(input, affine_matrix, (out_w, out_h), inverse_map=True)


def align_faces(
    images: torch.Tensor, landmarks5: torch.Tensor, size: int = 112, *, border_value: float = 0
) -> torch.Tensor:
    """Aligned face crops as insightface's norm_crop makes them, for a whole batch at once.

    images: [B, C, H, W]; landmarks5: [B, 5, 2] (left eye, right eye, nose, left and right mouth
    corners, in pixels). Each face's similarity transform (Umeyama) onto the ArcFace template of
    ``size`` is estimated on the images' device, then the batch is warped bilinearly.
    Returns [B, C, size, size]. A face whose landmarks are not all finite, or are degenerate (the five
    points within 1e-6 pixel of their mean: no scale to estimate), gets a crop filled with
    ``border_value``; the other faces of the batch are unaffected. No host synchronisation.
    """
    src4, _ = _check_src(images)
    if not isinstance(landmarks5, torch.Tensor) or landmarks5.dim() != 3 or tuple(landmarks5.shape[1:]) != (5, 2):
        raise ArgumentError("orbbec: 'landmarks5' must be a tensor of shape [B, 5, 2]")
    if landmarks5.shape[0] != src4.shape[0]:
        raise ArgumentError(f"orbbec: 'landmarks5' must have one row per image ({src4.shape[0]}), got {landmarks5.shape[0]}")
    template = arcface_template(size, dtype=torch.float64, device=landmarks5.device).expand(landmarks5.shape[0], 5, 2)
    pts = landmarks5.to(torch.float64)
    spread = (pts - pts.mean(-2, keepdim=True)).pow(2).sum(-1).mean(-1)
    bad = ~(torch.isfinite(pts).all(-1).all(-1) & (spread > 1e-12))
    # A bad face is estimated on the template (a harmless identity) so that the batched estimate sees
    # finite values, and its matrix is then made NaN: the warp gives a non-finite source position
    # the constant border value, whatever the border mode.
    M = estimate_similarity(torch.where(bad[:, None, None], template, pts), template)
    M = torch.where(bad[:, None, None], torch.full_like(M, float("nan")), M)
    return warp_affine(images, M.to(src4.device), (size, size), border_value=border_value)


def list_warp_args(M: torch.Tensor, dsize: Tuple[int, int], channels: int, *, border_value=0,
                   out_dtype: Optional[torch.dtype] = None, mean=None, std=None, scale: float = 1.0) -> tuple:
    """The arguments after the images that warp_affine passes to orbbec::warp_affine_list for a list
    of uint8 HWC images with `channels` channels, forward matrices M, bilinear, constant border and
    an NCHW output: for a caller that runs the op elsewhere (orbbec.data's loader warps each batch in
    the GPU decoder's thread, so the decoded images never travel through Python). The out_dtype
    travels by name; the op inverts M."""
    out_w, out_h = _output_size(dsize, None)
    out_dtype, mean_list, std_list = _output_transform(channels, torch.uint8 if out_dtype is None else out_dtype,
                                                       mean, std)
    return (M, out_h, out_w, _INTERPOLATIONS["bilinear"], _BORDERS["constant"], _border_values(border_value, channels),
            str(out_dtype).replace("torch.", ""), mean_list, std_list, float(scale), False, False)
