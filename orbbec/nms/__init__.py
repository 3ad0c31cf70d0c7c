"""Non-maximum suppression on CPU and CUDA: nms, batched_nms (class-aware) and soft_nms.

Conventions (details in docs/nms.md):
- boxes are [N, 4] (x1, y1, x2, y2), float16, bfloat16, float32 or float64; IoU is computed in
  float32 (float64 for float64 boxes) with torchvision's formula: area = (x2 - x1) * (y2 - y1),
  no +1.
- A box is suppressed when its IoU with a kept, higher-ranked box is strictly greater than
  iou_threshold: the keep set of torchvision.ops.nms.
- Rank: decreasing score; equal scores by lower index (a stable sort, so CPU and CUDA agree
  exactly); NaN scores rank first, as torch.sort orders them.
- Boxes with x2 < x1, y2 < y1 or a non-finite coordinate count as empty: their IoU with any box
  is 0, so (for iou_threshold >= 0) they never suppress and are never suppressed.
- Results are int64 indices into the input, in decreasing rank order; no boxes (any empty shape,
  (0,) or (0, 4)) give an empty int64 tensor. Outputs are not differentiable.
- Bad arguments raise orbbec.ArgumentError / ArgumentTypeError (ValueError / TypeError and
  RuntimeError, docs/errors.md); numpy arrays and quantized tensors are refused.
"""
from __future__ import annotations

import numbers
from typing import Optional, Tuple, Union

import torch

from .. import _library  # noqa: F401  (loads orbbec._C, which defines the ops)
from ..common import ArgumentError, ArgumentTypeError, call_op, check_not_quantized
from . import _ops  # noqa: F401  (fake kernels)

__all__ = ["nms", "batched_nms", "soft_nms", "SOFT_NMS_METHODS"]

# soft_nms method names and the codes of the op schema (the reference code's numbering).
SOFT_NMS_METHODS = {"linear": 1, "gaussian": 2}


def _number(value, name: str) -> float:
    if type(value) is float and value == value:  # the common call, before the ABC check's cost
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"orbbec.nms: '{name}' must be a number, got {type(value).__name__}")
    value = float(value)
    if value != value:
        raise ArgumentError(f"orbbec.nms: '{name}' must not be NaN")
    return value


def _check_tensor(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        # numpy arrays included: converting would leave the result's type (tensor or array) and
        # device to guess.
        raise ArgumentTypeError(f"orbbec.nms: '{name}' must be a torch.Tensor, got {type(t).__module__}."
                                f"{type(t).__name__}; numpy arrays are not accepted: pass torch.from_numpy(a)")
    check_not_quantized(t, name, "orbbec.nms")


def _empty(boxes, *others) -> bool:
    """No boxes, whatever the empty shape ((0,), (0, 4)): the result is empty, as in torchvision's
    batched_nms (torchvision's nms takes only (0, 4))."""
    return boxes.numel() == 0 and all(t.numel() == 0 for t in others)


def _check_boxes_scores(boxes, scores) -> None:
    """Shapes and dtypes of tensors that _check_tensor has passed."""
    if boxes.dim() != 2 or boxes.shape[1] != 4:
        raise ArgumentError(f"orbbec.nms: 'boxes' must have shape [N, 4] (x1, y1, x2, y2), got {tuple(boxes.shape)}")
    if not boxes.is_floating_point():
        raise ArgumentTypeError(f"orbbec.nms: 'boxes' must be a floating-point tensor, got {boxes.dtype}")
    if scores.dim() != 1:
        raise ArgumentError(f"orbbec.nms: 'scores' must be a 1-D tensor, got shape {tuple(scores.shape)}")
    if not scores.is_floating_point():
        raise ArgumentTypeError(f"orbbec.nms: 'scores' must be a floating-point tensor, got {scores.dtype}")
    if scores.shape[0] != boxes.shape[0]:
        raise ArgumentError(
            f"orbbec.nms: 'scores' must hold one score per box ({boxes.shape[0]}), got {scores.shape[0]}")
    if scores.device != boxes.device:
        raise ArgumentError(f"orbbec.nms: 'scores' must be on the device of 'boxes' ({boxes.device}), got {scores.device}")


def nms(boxes: torch.Tensor, scores: Union[torch.Tensor, float, None] = None,
        iou_threshold: Optional[float] = None) -> torch.Tensor:
    """Indices (int64) of the boxes kept by non-maximum suppression, in decreasing score order.

    Two forms:
      nms(boxes[N, 4], scores[N], iou_threshold)   as torchvision.ops.nms
      nms(dets[N, 5], iou_threshold)               the score in column 4

    A box is suppressed when its IoU with a kept, higher-scored box is > iou_threshold.
    """
    _check_tensor(boxes, "boxes")
    if not isinstance(scores, torch.Tensor) and not isinstance(scores, numbers.Real) and scores is not None:
        _check_tensor(scores, "scores")  # e.g. a numpy array: say so, not "no third argument"
    if not isinstance(scores, torch.Tensor):  # dets form: nms(dets, 0.5) or nms(dets, iou_threshold=0.5)
        if scores is not None and iou_threshold is not None:
            raise ArgumentTypeError("orbbec.nms: nms(dets, iou_threshold) takes no third argument; "
                            "use nms(boxes, scores, iou_threshold)")
        thr = scores if scores is not None else iou_threshold
        if thr is None:
            raise ArgumentTypeError("orbbec.nms: 'iou_threshold' is missing")
        if _empty(boxes):
            return _empty_result(boxes, thr)
        if boxes.dim() != 2 or boxes.shape[1] != 5:
            raise ArgumentError(f"orbbec.nms: 'dets' must have shape [N, 5] (x1, y1, x2, y2, score), "
                                f"got {tuple(boxes.shape)}")
        boxes, scores, iou_threshold = boxes[:, :4], boxes[:, 4], thr
    if iou_threshold is None:
        raise ArgumentTypeError("orbbec.nms: 'iou_threshold' is missing")
    _check_tensor(scores, "scores")
    if _empty(boxes, scores):
        return _empty_result(boxes, iou_threshold)
    _check_boxes_scores(boxes, scores)
    return call_op(torch.ops.orbbec.nms, boxes, scores, _number(iou_threshold, "iou_threshold"))


def _empty_result(boxes: torch.Tensor, iou_threshold) -> torch.Tensor:
    _number(iou_threshold, "iou_threshold")  # still a bad argument when there are no boxes
    return torch.empty((0,), dtype=torch.int64, device=boxes.device)


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor,
                iou_threshold: float) -> torch.Tensor:
    """nms within each class: boxes with different idxs never suppress each other.

    Returns int64 indices in decreasing score order, the same set as running nms on each class
    (torchvision.ops.batched_nms). On CUDA all classes go through one mask and one scan.
    """
    _check_tensor(boxes, "boxes")
    _check_tensor(scores, "scores")
    _check_tensor(idxs, "idxs")
    if _empty(boxes, scores, idxs):
        return _empty_result(boxes, iou_threshold)
    _check_boxes_scores(boxes, scores)
    if idxs.dim() != 1 or idxs.shape[0] != boxes.shape[0]:
        raise ArgumentError(f"orbbec.nms: 'idxs' must have shape [{boxes.shape[0]}] (one class id per box), "
                         f"got {tuple(idxs.shape)}")
    if idxs.is_floating_point() or idxs.is_complex() or idxs.dtype == torch.bool:
        raise ArgumentTypeError(f"orbbec.nms: 'idxs' must be an integer tensor (class ids), got {idxs.dtype}")
    if idxs.device != boxes.device:
        raise ArgumentError(f"orbbec.nms: 'idxs' must be on the device of 'boxes' ({boxes.device}), got {idxs.device}")
    return call_op(torch.ops.orbbec.batched_nms, boxes, scores, idxs, _number(iou_threshold, "iou_threshold"))


def soft_nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float = 0.3, sigma: float = 0.5,
             score_threshold: float = 0.001, method: str = "linear") -> Tuple[torch.Tensor, torch.Tensor]:
    """Soft-NMS (Bodla et al. 2017, the reference code's algorithm). Returns (indices, scores).

    Repeatedly selects the highest-scored remaining box; every remaining box that intersects it
    (intersection width and height > 0) has its score multiplied by
      linear:   1 - iou if iou > iou_threshold, else 1
      gaussian: exp(-iou**2 / sigma)
    and is dropped when the new score is < score_threshold. Returns the selected indices (int64) in
    selection order and their decayed scores (dtype of scores). As in the reference, a box whose
    initial score is below score_threshold is only dropped when it intersects a selected box.
    Ties: lower index first. Scores are computed in float32 (float64 for float64 boxes).
    """
    _check_tensor(boxes, "boxes")
    _check_tensor(scores, "scores")
    _check_boxes_scores(boxes, scores)
    if method not in SOFT_NMS_METHODS:
        raise ArgumentError(f"orbbec.nms: 'method' must be one of {sorted(SOFT_NMS_METHODS)}, got {method!r}")
    sigma = _number(sigma, "sigma")
    if not sigma > 0 or sigma == float("inf"):
        raise ArgumentError(f"orbbec.nms: 'sigma' must be a positive number, got {sigma}")
    return call_op(torch.ops.orbbec.soft_nms, boxes, scores, _number(iou_threshold, "iou_threshold"), sigma,
                   _number(score_threshold, "score_threshold"), SOFT_NMS_METHODS[method])
