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


def _moved_xy(M, x, y, shift: float):
    """Points (x, y) through M [..., 2, 3] (one matrix, or one per row of the points), element by
    element in numpy or torch (the same bits in both). M works on pixel centres: continuous
    coordinates (pixel i spans [i, i+1)) shift by half a pixel around it, pixel-centre ones (shift=0)
    do not."""
    m = M[..., None, :, :] if M.ndim > 2 else M  # one matrix per row: broadcast over the row's points
    x, y = x - shift, y - shift
    return (x * m[..., 0, 0] + y * m[..., 0, 1] + m[..., 0, 2] + shift,
            x * m[..., 1, 0] + y * m[..., 1, 1] + m[..., 1, 2] + shift)


def _as_float64(values, M):
    """(array module, values and M as float64, the dtype results come back in) for numpy values
    (numpy's module: a loader worker's targets, where a small torch op costs several times a numpy
    one's host time) or anything else (torch's)."""
    if isinstance(values, np.ndarray):
        dtype = values.dtype if np.issubdtype(values.dtype, np.floating) else np.dtype(np.float32)
        return np, values.astype(np.float64), np.asarray(M, dtype=np.float64), dtype
    t = torch.as_tensor(values)
    dtype = t.dtype if t.is_floating_point() else torch.float32
    # Numbers not in a tensor yet (lists) go to float64 as they are, not rounded to float32 first.
    t = t.to(torch.float64) if isinstance(values, torch.Tensor) else torch.as_tensor(values, dtype=torch.float64)
    return torch, t, torch.as_tensor(M, dtype=torch.float64), dtype


def _enclosing_xy(xp, b, M):
    """(lo_x, lo_y, hi_x, hi_y) [N] of float64 boxes b [N, 4] through M [2, 3] or [N, 2, 3]: the
    extremes of their four corners moved."""
    x, y = _moved_xy(M, b[:, [0, 2, 0, 2]], b[:, [1, 1, 3, 3]], 0.5)
    return xp.amin(x, 1), xp.amin(y, 1), xp.amax(x, 1), xp.amax(y, 1)


def enclosing_boxes(boxes, M) -> torch.Tensor:
    """Boxes [N, 4] xyxy -> the boxes enclosing their four corners through M ([2, 3] or [N, 2, 3]),
    float64, unclipped."""
    M = torch.as_tensor(M, dtype=torch.float64)
    b = torch.as_tensor(boxes, dtype=torch.float64).reshape(-1, 4)
    return torch.stack(_enclosing_xy(torch, b, M), dim=1)


def transform_boxes(boxes, M, size: Tuple[int, int], min_visible: float = 0.0, min_size: float = 1.0):
    """Boxes [N, 4] xyxy -> (boxes [K, 4], kept [N] bool): the four corners through M, their
    enclosing box clipped to the output (height, width) `size`. A box is dropped when less than
    `min_visible` of its transformed area, or less than `min_size` pixels of width or height, remains.
    M is [2, 3], or one matrix per box [N, 2, 3] (the boxes of a whole batch in one call).
    Numpy boxes give numpy results (the same values), anything else torch tensors."""
    xp, b, M, dtype = _as_float64(boxes, M)
    b = b.reshape(-1, 4)
    lx, ly, hx, hy = _enclosing_xy(xp, b, M)
    full = (hx - lx) * (hy - ly)
    h, w = size
    lx, hx = xp.clip(lx, 0.0, float(w)), xp.clip(hx, 0.0, float(w))
    ly, hy = xp.clip(ly, 0.0, float(h)), xp.clip(hy, 0.0, float(h))
    bw, bh = hx - lx, hy - ly
    kept = (bw >= min_size) & (bh >= min_size) & (bw * bh >= min_visible * full)
    out = xp.stack([lx, ly, hx, hy], 1)[kept]
    return (out.astype(dtype) if xp is np else out.to(dtype)), kept


def transform_keypoints(points, M, size: Tuple[int, int], flipped=False,
                        flip_pairs: Optional[Sequence[Tuple[int, int]]] = None, pixel_centres: bool = False):
    """Keypoints [..., K, 2] -> (points [..., K, 2], inside [..., K] bool). `inside` flags points
    that landed in the output (height, width) `size`. When the sample was flipped horizontally and
    `flip_pairs` names left/right pairs (e.g. eyes), the pairs swap places so that "left eye" stays
    the left eye of the flipped face. pixel_centres: the points use cv2's convention (pixel centres at
    integers), as face landmarks usually do, instead of torchvision's. A batch at once: points
    [B, K, 2], M [B, 2, 3] and `flipped` a bool array or tensor [B]. Numpy points give numpy results
    (the same values), anything else torch tensors."""
    # (lists of points as a tensor first: through float32, as keypoints always went)
    xp, pf, M, dtype = _as_float64(points if isinstance(points, np.ndarray) else torch.as_tensor(points), M)
    x, y = _moved_xy(M, pf[..., 0], pf[..., 1], 0.0 if pixel_centres else 0.5)
    moved = xp.stack([x, y], -1)
    if flip_pairs:
        order = list(range(moved.shape[-2]))
        for a, b in flip_pairs:
            order[a], order[b] = b, a
        if isinstance(flipped, (np.ndarray, torch.Tensor)):
            moved = xp.where(xp.asarray(flipped).reshape(-1, 1, 1), moved[..., order, :], moved)
        elif flipped:
            moved = moved[..., order, :]
    h, w = size
    inside = (moved[..., 0] >= 0) & (moved[..., 0] < w) & (moved[..., 1] >= 0) & (moved[..., 1] < h)
    return (moved.astype(dtype) if xp is np else moved.to(dtype)), inside


# Left/right pairs of the 5 face landmarks (eyes, nose, mouth corners): a horizontal flip swaps them.
FACE5_FLIP_PAIRS = ((0, 1), (3, 4))


def transform_landmarks(points, M, size, flipped: bool = False, flip_pairs=FACE5_FLIP_PAIRS):
    """Face landmarks [..., 5, 2] in cv2's pixel-centre convention, as AlignFaces reads them."""
    return transform_keypoints(points, M, size, flipped, flip_pairs, pixel_centres=True)
