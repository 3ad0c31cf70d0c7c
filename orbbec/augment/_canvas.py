"""Transforms that change the canvas: padding, random crops (with padding), zoom-out and the
detection recipes' random rescaling, with torchvision.transforms.v2's names, arguments and draws.

Each is a matrix and the size it leaves, as in _geometry.py. What lies outside the image after a
pad takes the warp's border (the loader's `border_value`, 0 by default, as torchvision's fill), so
`fill` is accepted only as 0 and `padding_mode` only as "constant": one warp has one border.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

from ..common import ArgumentError
from ._geometry import Size, _constant_border, _pair, scale_region

Padding = Tuple[int, int, int, int]  # left, top, right, bottom


def _padding(padding, name) -> Padding:
    """torchvision's padding argument: an int for every side, (left/right, top/bottom) or (left, top,
    right, bottom)."""
    if isinstance(padding, int):
        p = (padding,) * 4
    else:
        p = tuple(int(v) for v in padding)
        p = {1: p * 4, 2: (p[0], p[1], p[0], p[1]), 4: p}.get(len(p))
    if p is None or min(p) < 0:
        raise ArgumentError(f"{name}: padding must be an int >= 0 or 2 or 4 of them, got {padding}")
    return p


def _shift(dx: float, dy: float) -> np.ndarray:
    return np.array([[1.0, 0, dx], [0, 1.0, dy], [0, 0, 1]])


class Pad:
    """torchvision's Pad: `padding` pixels added on each side (filled with the border)."""

    def __init__(self, padding, fill=0, padding_mode: str = "constant"):
        self.padding = _padding(padding, "Pad")
        _constant_border("Pad", fill, padding_mode)

    def __call__(self, rng, size: Size):
        left, top, right, bottom = self.padding
        return _shift(left, top), (size[0] + top + bottom, size[1] + left + right), {"padding": self.padding}


class RandomCrop:
    """torchvision's RandomCrop: pad by `padding`, then (pad_if_needed) by the missing height or width
    on both sides, then a crop of `size` at a uniform offset. Params: the padding (left, top, right,
    bottom) and the crop (left, top, width, height) in the padded image, as torchvision's F.pad and
    F.crop take them."""

    def __init__(self, size, padding=None, pad_if_needed: bool = False, fill=0, padding_mode: str = "constant"):
        self.size = _pair(size, "RandomCrop.size")
        self.padding = _padding(padding, "RandomCrop") if padding else (0, 0, 0, 0)
        self.pad_if_needed = pad_if_needed
        _constant_border("RandomCrop", fill, padding_mode)

    def __call__(self, rng, size: Size):
        (ch, cw), (h, w) = self.size, size
        left, top, right, bottom = self.padding
        h, w = h + top + bottom, w + left + right
        if self.pad_if_needed and h < ch:
            top, bottom, h = top + ch - h, bottom + ch - h, h + 2 * (ch - h)
        if self.pad_if_needed and w < cw:
            left, right, w = left + cw - w, right + cw - w, w + 2 * (cw - w)
        if h < ch or w < cw:
            raise ArgumentError(f"RandomCrop: the crop {self.size} is larger than the (padded) image {(h, w)}; "
                                "set pad_if_needed=True")
        y = int(rng.integers(0, h - ch + 1)) if h > ch else 0
        x = int(rng.integers(0, w - cw + 1)) if w > cw else 0
        return _shift(left - x, top - y), self.size, {"padding": (left, top, right, bottom), "crop": (x, y, cw, ch)}


class RandomZoomOut:
    """torchvision's RandomZoomOut (SSD): with probability p, the image on a canvas `side_range` times
    its size, at a uniform place; the size changes, so a fixed-size transform must follow."""

    def __init__(self, fill=0, side_range: Sequence[float] = (1.0, 4.0), p: float = 0.5):
        if len(side_range) != 2 or side_range[0] < 1.0 or side_range[0] > side_range[1]:
            raise ArgumentError(f"RandomZoomOut: side_range must be (a, b) with 1 <= a <= b, got {side_range}")
        _constant_border("RandomZoomOut", fill)
        self.side_range, self.p = (float(side_range[0]), float(side_range[1])), p

    def __call__(self, rng, size: Size):
        if rng.uniform() >= self.p:
            return np.eye(3), size, {"padding": (0, 0, 0, 0)}
        h, w = size
        r = self.side_range[0] + rng.uniform() * (self.side_range[1] - self.side_range[0])
        canvas_w, canvas_h = int(w * r), int(h * r)
        left, top = int((canvas_w - w) * rng.uniform()), int((canvas_h - h) * rng.uniform())
        padding = (left, top, canvas_w - left - w, canvas_h - top - h)
        return _shift(left, top), (canvas_h, canvas_w), {"padding": padding}


def _resize_to(size: Size, out: Size):
    return scale_region(0, 0, size[1], size[0], out), out, {"size": out}


class ScaleJitter:
    """torchvision's ScaleJitter (large-scale jitter): resized by min(target_size[1] / height,
    target_size[0] / width) (torchvision's own pairing) times a scale uniform in `scale_range`."""

    def __init__(self, target_size: Sequence[int], scale_range: Tuple[float, float] = (0.1, 2.0)):
        self.target_size, self.scale_range = _pair(target_size, "ScaleJitter.target_size"), scale_range

    def __call__(self, rng, size: Size):
        h, w = size
        scale = self.scale_range[0] + rng.uniform() * (self.scale_range[1] - self.scale_range[0])
        r = min(self.target_size[1] / h, self.target_size[0] / w) * scale
        return _resize_to(size, (max(1, int(h * r)), max(1, int(w * r))))


class RandomShortestSize:
    """torchvision's RandomShortestSize: the shorter side resized to one of `min_size` (drawn), the
    longer one kept within `max_size`."""

    def __init__(self, min_size, max_size: Optional[int] = None):
        self.min_size = [int(min_size)] if isinstance(min_size, int) else [int(v) for v in min_size]
        self.max_size = max_size

    def __call__(self, rng, size: Size):
        h, w = size
        r = self.min_size[int(rng.integers(0, len(self.min_size)))] / min(h, w)
        if self.max_size is not None:
            r = min(r, self.max_size / max(h, w))
        return _resize_to(size, (max(1, int(h * r)), max(1, int(w * r))))


class RandomIoUCrop:
    """torchvision's RandomIoUCrop (SSD): draw a minimum overlap from `sampler_options` (>= 1: leave
    the image as it is), then up to `trials` crops of `min_scale`-`max_scale` of each side within
    the aspect range, until one contains the centre of a box and overlaps one of those boxes by the
    drawn IoU. Boxes whose centre falls outside the crop are dropped with their labels (the loader
    does it; params "keep"). torchvision draws options until one succeeds, and so never ends for an
    image without boxes; here such an image is left as it is, and so is one for which
    `max_options` options found no crop. The boxes it sees are the sample's "boxes" moved by the
    transforms before it."""
    needs_boxes = True

    def __init__(self, min_scale: float = 0.3, max_scale: float = 1.0, min_aspect_ratio: float = 0.5,
                 max_aspect_ratio: float = 2.0, sampler_options: Optional[Sequence[float]] = None,
                 trials: int = 40, max_options: int = 100):
        self.min_scale, self.max_scale = min_scale, max_scale
        self.min_aspect_ratio, self.max_aspect_ratio = min_aspect_ratio, max_aspect_ratio
        self.options = list(sampler_options) if sampler_options is not None else [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 2.0]
        self.trials, self.max_options = trials, max_options

    def _crop(self, rng, size: Size, boxes: np.ndarray):
        h, w = size
        cx, cy = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
        for _ in range(self.max_options):
            min_iou = self.options[int(rng.integers(0, len(self.options)))]
            if min_iou >= 1.0 or len(boxes) == 0:
                return None, min_iou
            for _ in range(self.trials):
                new_w = int(w * (self.min_scale + (self.max_scale - self.min_scale) * rng.uniform()))
                new_h = int(h * (self.min_scale + (self.max_scale - self.min_scale) * rng.uniform()))
                if new_w == 0 or new_h == 0 or not self.min_aspect_ratio <= new_w / new_h <= self.max_aspect_ratio:
                    continue
                left, top = int((w - new_w) * rng.uniform()), int((h - new_h) * rng.uniform())
                right, bottom = left + new_w, top + new_h
                inside = (left < cx) & (cx < right) & (top < cy) & (cy < bottom)
                if not inside.any():
                    continue
                b = boxes[inside]
                iw = np.clip(np.minimum(b[:, 2], right) - np.maximum(b[:, 0], left), 0, None)
                ih = np.clip(np.minimum(b[:, 3], bottom) - np.maximum(b[:, 1], top), 0, None)
                inter = iw * ih
                union = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]) + new_w * new_h - inter
                if (inter / union).max() < min_iou:
                    continue
                return (left, top, new_w, new_h, inside), min_iou
        return None, None

    def __call__(self, rng, size: Size, boxes):
        boxes = np.zeros((0, 4)) if boxes is None else np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        crop, min_iou = self._crop(rng, size, boxes)
        if crop is None:
            return np.eye(3), size, {"crop": None, "min_iou": min_iou, "keep": None}
        left, top, w, h, inside = crop
        return _shift(-left, -top), (h, w), {"crop": (left, top, w, h), "min_iou": min_iou,
                                             "keep": [bool(v) for v in inside]}
