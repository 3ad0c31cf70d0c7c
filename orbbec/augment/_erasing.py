"""RandomErasing with torchvision.transforms.v2's arguments and draws, per sample: a rectangle of
each sample that drew one is filled with `value`, on the finished (normalised) batch, as torchvision's
recipes place it after Normalize."""
from __future__ import annotations

import math
from typing import List, Sequence

import torch

from ..common import ArgumentError
from ._color import apply_to_rows


class RandomErasing:
    """With probability p, a rectangle of `scale` of the area and `ratio` of aspect (10 tries, else
    nothing is erased) at a uniform place, filled with `value` (a number, or one per channel).
    torchvision's value="random" (normal noise) is not taken."""

    def __init__(self, p: float = 0.5, scale: Sequence[float] = (0.02, 0.33), ratio: Sequence[float] = (0.3, 3.3),
                 value=0.0):
        if isinstance(value, str):
            raise ArgumentError("RandomErasing: value must be a number or one per channel ('random' is not taken)")
        if not (0 <= p <= 1) or scale[0] > scale[1] or ratio[0] > ratio[1] or min(scale) < 0:
            raise ArgumentError(f"RandomErasing: need 0 <= p <= 1 and (min, max) ranges, got p={p}, scale={scale}, "
                                f"ratio={ratio}")
        self.p, self.scale, self.ratio = p, tuple(scale), tuple(ratio)
        self.value = [float(value)] if isinstance(value, (int, float)) else [float(v) for v in value]
        self._log_ratio = (math.log(ratio[0]), math.log(ratio[1]))

    def draw_at(self, rng, size) -> dict:
        """The rectangle (top, left, height, width) for an output of `size` (height, width), or none."""
        if rng.uniform() >= self.p:
            return {"erase": None}
        img_h, img_w = size
        for _ in range(10):
            area = img_h * img_w * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*self._log_ratio))
            h, w = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
            if h < img_h and w < img_w:
                top, left = int(rng.integers(0, img_h - h + 1)), int(rng.integers(0, img_w - w + 1))
                return {"erase": (top, left, h, w)}
        return {"erase": None}

    def apply_batch(self, x: torch.Tensor, rects: List) -> torch.Tensor:
        """x [B, C, H, W]: the drawn rectangles filled, all samples at once (no host sync)."""
        rows = [(i, r) for i, r in enumerate(rects) if r is not None]
        if not rows:
            return x
        if len(self.value) not in (1, x.shape[1]):
            raise ArgumentError(f"RandomErasing: value has {len(self.value)} numbers for {x.shape[1]} channels")
        box = torch.tensor([r for _, r in rows], dtype=torch.int64).to(x.device, non_blocking=True)
        ys = torch.arange(x.shape[2], device=x.device).view(1, -1, 1)
        xs = torch.arange(x.shape[3], device=x.device).view(1, 1, -1)
        top, left, h, w = (box[:, k].view(-1, 1, 1) for k in range(4))
        inside = (ys >= top) & (ys < top + h) & (xs >= left) & (xs < left + w)
        value = torch.tensor(self.value, dtype=x.dtype).to(x.device, non_blocking=True).view(1, -1, 1, 1)
        return apply_to_rows(x, [i for i, _ in rows], lambda part: torch.where(inside.unsqueeze(1), value, part))
