"""Targets follow their image: boxes (xyxy) and keypoints (x, y) in continuous pixel coordinates,
as torchvision's tv_tensors use them (pixel i spans [i, i+1)), moved by the sample's matrix."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import torch


def stacked_arrays(values) -> Optional[np.ndarray]:
    """np.stack(values) when every value is a numpy array of one shape, else None. A batch's
    targets in that form (a face dataset's landmarks) are converted once rather than sample by
    sample: per-sample conversions cost a loader worker about a tenth of a face batch."""
    if not values or not isinstance(values[0], np.ndarray):
        return None
    shape = values[0].shape
    if not all(isinstance(v, np.ndarray) and v.shape == shape for v in values):
        return None
    return np.stack(values)


def _apply(points: torch.Tensor, M: torch.Tensor, shift: float = 0.5) -> torch.Tensor:
    """Points [..., 2] through M [2, 3] (or points [B, K, 2] through M [B, 2, 3]), which works on
    pixel centres: continuous coordinates (pixel i spans [i, i+1)) shift by half a pixel around it,
    pixel-centre ones (shift=0) do not."""
    p = points.to(M.dtype) - shift
    return (p @ M[..., :2].transpose(-1, -2) + M[..., 2].unsqueeze(-2)) + shift


def enclosing_boxes(boxes, M) -> torch.Tensor:
    """Boxes [N, 4] xyxy -> the boxes enclosing their four corners through M ([2, 3] or [N, 2, 3]),
    float64, unclipped."""
    M = torch.as_tensor(M, dtype=torch.float64)
    b = torch.as_tensor(boxes, dtype=torch.float64).reshape(-1, 4)
    corners = torch.stack([b[:, [0, 1]], b[:, [2, 1]], b[:, [0, 3]], b[:, [2, 3]]], dim=1)
    moved = _apply(corners, M)
    return torch.cat([moved.min(dim=1).values, moved.max(dim=1).values], dim=1)


def transform_boxes(boxes: torch.Tensor, M: torch.Tensor, size: Tuple[int, int],
                    min_visible: float = 0.0, min_size: float = 1.0):
    """Boxes [N, 4] xyxy -> (boxes [K, 4], kept [N] bool): the four corners through M, their
    enclosing box clipped to the output (height, width) `size`. A box is dropped when less than
    `min_visible` of its transformed area, or less than `min_size` pixels of width or height, remains.
    M is [2, 3], or one matrix per box [N, 2, 3] (the boxes of a whole batch in one call)."""
    lo, hi = enclosing_boxes(boxes, M).split(2, dim=1)
    full = (hi - lo).prod(dim=1)
    h, w = size
    limit = torch.tensor([w, h], dtype=torch.float64)
    lo_c, hi_c = torch.minimum(torch.clamp(lo, min=0), limit), torch.minimum(torch.clamp(hi, min=0), limit)
    wh = hi_c - lo_c
    kept = (wh >= min_size).all(dim=1) & (wh.prod(dim=1) >= min_visible * full)
    out = torch.cat([lo_c, hi_c], dim=1)[kept]
    return out.to(torch.as_tensor(boxes).dtype if torch.as_tensor(boxes).is_floating_point() else torch.float32), kept


def transform_keypoints(points: torch.Tensor, M: torch.Tensor, size: Tuple[int, int], flipped: bool = False,
                        flip_pairs: Optional[Sequence[Tuple[int, int]]] = None, pixel_centres: bool = False):
    """Keypoints [..., K, 2] -> (points [..., K, 2], inside [..., K] bool). `inside` flags points
    that landed in the output (height, width) `size`. When the sample was flipped horizontally and
    `flip_pairs` names left/right pairs (e.g. eyes), the pairs swap places so that "left eye" stays
    the left eye of the flipped face. pixel_centres: the points use cv2's convention (pixel centres at
    integers), as face landmarks usually do, instead of torchvision's. A batch at once: points
    [B, K, 2], M [B, 2, 3] and `flipped` a bool tensor [B]."""
    M = torch.as_tensor(M, dtype=torch.float64)
    p = torch.as_tensor(points)
    moved = _apply(p, M, 0.0 if pixel_centres else 0.5)
    if flip_pairs:
        order = list(range(moved.shape[-2]))
        for a, b in flip_pairs:
            order[a], order[b] = b, a
        if isinstance(flipped, torch.Tensor):
            moved = torch.where(flipped.reshape(-1, 1, 1), moved[..., order, :], moved)
        elif flipped:
            moved = moved[..., order, :]
    h, w = size
    inside = (moved[..., 0] >= 0) & (moved[..., 0] < w) & (moved[..., 1] >= 0) & (moved[..., 1] < h)
    return moved.to(p.dtype if p.is_floating_point() else torch.float32), inside


# Left/right pairs of the 5 face landmarks (eyes, nose, mouth corners): a horizontal flip swaps them.
FACE5_FLIP_PAIRS = ((0, 1), (3, 4))


def transform_landmarks(points, M, size, flipped: bool = False, flip_pairs=FACE5_FLIP_PAIRS):
    """Face landmarks [..., 5, 2] in cv2's pixel-centre convention, as AlignFaces reads them."""
    return transform_keypoints(points, M, size, flipped, flip_pairs, pixel_centres=True)
