"""Photometric transforms with torchvision.transforms.v2's names and meanings, drawn per sample and
applied to the whole float batch (values in [0, 1], RGB, NCHW) after the warp.

Each transform draws its parameters in `draw(rng)` and returns a dict; `apply_photometric` then runs
them on the batch. A sample's ColorJitter runs its four adjustments in its own random order, as
torchvision's does: for each of the four positions, every adjustment is applied at once to the samples
that put it there, so the batch costs four passes of each adjustment at most, whatever its size.
"""
from __future__ import annotations

from typing import List

import torch

# ITU-R 601-2 luma, torchvision's rgb_to_grayscale weights.
_LUMA = (0.2989, 0.587, 0.114)
_ADJUSTMENTS = ("brightness", "contrast", "saturation", "hue")
_IDENTITY = {"brightness": 1.0, "contrast": 1.0, "saturation": 1.0, "hue": 0.0}


def _factor_range(v, name, center=1.0, bound=(0.0, float("inf"))):
    if v is None:
        return None
    if isinstance(v, (int, float)):
        if v < 0:
            raise ValueError(f"ColorJitter: {name} must be >= 0, got {v}")
        lo, hi = center - v, center + v
        if name != "hue":
            lo = max(lo, 0.0)
    else:
        lo, hi = float(v[0]), float(v[1])
    if not (bound[0] <= lo <= hi <= bound[1]):
        raise ValueError(f"ColorJitter: {name} values must lie in {list(bound)} with min <= max, got {(lo, hi)}")
    return None if lo == hi == center else (lo, hi)


class ColorJitter:
    """torchvision's ColorJitter: brightness, contrast and saturation factors uniform in
    [max(0, 1 - v), 1 + v] (or a given (min, max)); hue shift uniform in [-v, v] with v <= 0.5; the
    four adjustments in a random order per sample."""

    def __init__(self, brightness=None, contrast=None, saturation=None, hue=None):
        self.ranges = {
            "brightness": _factor_range(brightness, "brightness"),
            "contrast": _factor_range(contrast, "contrast"),
            "saturation": _factor_range(saturation, "saturation"),
            "hue": _factor_range(hue, "hue", center=0.0, bound=(-0.5, 0.5)),
        }

    def draw(self, rng) -> dict:
        order = [int(i) for i in rng.permutation(4)]
        p = {"order": order}
        for name in _ADJUSTMENTS:
            r = self.ranges[name]
            p[name] = float(rng.uniform(*r)) if r is not None else _IDENTITY[name]
        return p


class RandomGrayscale:
    """torchvision's RandomGrayscale: with probability p the image becomes its luma in all channels."""

    def __init__(self, p: float = 0.1):
        self.p = p

    def draw(self, rng) -> dict:
        return {"gray": bool(rng.uniform() < self.p)}


def grayscale(x: torch.Tensor) -> torch.Tensor:
    """Luma of an RGB batch [B, 3, H, W] -> [B, 1, H, W]."""
    r, g, b = x.unbind(1)
    return (r * _LUMA[0] + g * _LUMA[1] + b * _LUMA[2]).unsqueeze(1)


def _per_sample(values, x) -> torch.Tensor:
    return torch.tensor(values, dtype=x.dtype).to(x.device, non_blocking=True).view(-1, 1, 1, 1)


def apply_to_rows(x: torch.Tensor, rows: List[int], fn) -> torch.Tensor:
    """x with fn applied to the samples `rows` at once: the batch itself when they are all of it,
    else a gathered part written back. Returns the result (x itself, or fn's new tensor)."""
    if not rows:
        return x
    if len(rows) == x.shape[0]:
        return fn(x)
    idx = torch.tensor(rows).to(x.device, non_blocking=True)
    return x.index_copy_(0, idx, fn(x.index_select(0, idx)))


def adjust_brightness(x, f):
    return (x * f).clamp_(0, 1)


def adjust_contrast(x, f):
    # Each sample's mean summed in float64: a CUDA reduction's order depends on the batch's size, and
    # in float32 a sample's mean differed by one unit in the last place between a batch of 6 and the
    # same batch less a skipped sample (H100); rounded from float64 the orders agree.
    mean = grayscale(x).to(torch.float64).mean(dim=(1, 2, 3), keepdim=True).to(x.dtype)
    return (x * f + mean * (1 - f)).clamp_(0, 1)


def adjust_saturation(x, f):
    return (x * f + grayscale(x) * (1 - f)).clamp_(0, 1)


def adjust_hue(x, shift):
    """Rotates the hue (HSV) of each sample by `shift` [B] turns, keeping saturation and value."""
    r, g, b = x.unbind(1)
    v = x.amax(dim=1)
    chroma = v - x.amin(dim=1)
    grey = chroma == 0
    safe = torch.where(grey, torch.ones_like(chroma), chroma)
    s = torch.where(grey, torch.zeros_like(v), chroma / torch.where(v == 0, torch.ones_like(v), v))
    # hue in sixths of a turn, measured from red, green or blue, whichever is the largest (red first)
    sixths = torch.where(v == r, torch.remainder((g - b) / safe, 6.0),
                         torch.where(v == g, (b - r) / safe + 2.0, (r - g) / safe + 4.0))
    sixths = torch.where(grey, torch.zeros_like(sixths), sixths)
    turns = torch.remainder(sixths / 6.0 + shift.view(-1, 1, 1), 1.0)
    # back to RGB: channel n (5 red, 3 green, 1 blue) is v - v s clamp(min(k, 4 - k), 0, 1),
    # k = (n + 6 hue) mod 6
    out = []
    for n in (5.0, 3.0, 1.0):
        k = torch.remainder(n + 6.0 * turns, 6.0)
        out.append(v - v * s * torch.clamp(torch.minimum(k, 4.0 - k), 0.0, 1.0))
    return torch.stack(out, dim=1)


_APPLY = {"brightness": adjust_brightness, "contrast": adjust_contrast, "saturation": adjust_saturation,
          "hue": lambda x, f: adjust_hue(x, f.view(-1))}


def apply_photometric(x: torch.Tensor, samples: List[dict], transforms) -> torch.Tensor:
    """Runs the photometric transforms (in their Compose order) on x [B, 3, H, W] float in [0, 1],
    with each sample's drawn parameters (samples[i][name])."""
    for t in transforms:
        if hasattr(t, "apply_colour"):  # a transform that applies itself (a policy, RandomPhotometricDistort)
            x = t.apply_colour(x, samples)
            continue
        key = type(t).__name__
        draws = [s[key] for s in samples]
        if isinstance(t, RandomGrayscale):
            rows = [i for i, d in enumerate(draws) if d["gray"]]
            x = apply_to_rows(x, rows, lambda part: grayscale(part).expand(-1, 3, -1, -1).contiguous())
            continue
        for position in range(4):
            for a, name in enumerate(_ADJUSTMENTS):
                if t.ranges[name] is None:
                    continue
                rows = [i for i, d in enumerate(draws) if d["order"][position] == a]
                f = _per_sample([draws[i][name] for i in rows], x) if rows else None
                x = apply_to_rows(x, rows, lambda part: _APPLY[name](part, f))
    return x


def is_photometric(t) -> bool:
    """Whether t works on the warped batch's colours (a policy does, besides its geometric part)."""
    return isinstance(t, (ColorJitter, RandomGrayscale)) or hasattr(t, "apply_colour")


class RandomPhotometricDistort:
    """torchvision's RandomPhotometricDistort (SSD): brightness, contrast, saturation and hue each
    with probability p, factors uniform in their ranges; the contrast before or after saturation and
    hue (even odds); then, with probability p, the channels in a random order."""

    def __init__(self, brightness=(0.875, 1.125), contrast=(0.5, 1.5), saturation=(0.5, 1.5), hue=(-0.05, 0.05),
                 p: float = 0.5):
        self.ranges = {"brightness": _factor_range(brightness, "brightness"),
                       "contrast": _factor_range(contrast, "contrast"),
                       "saturation": _factor_range(saturation, "saturation"),
                       "hue": _factor_range(hue, "hue", center=0.0, bound=(-0.5, 0.5))}
        self.p = p

    def draw(self, rng) -> dict:
        d = {}
        for name in _ADJUSTMENTS:
            r = self.ranges[name]
            drawn = rng.uniform() < self.p
            d[name] = float(rng.uniform(*r)) if drawn and r is not None else None
        d["contrast_before"] = bool(rng.uniform() < 0.5)
        d["channels"] = [int(c) for c in rng.permutation(3)] if rng.uniform() < self.p else None
        return d

    def apply_colour(self, x: torch.Tensor, samples: List[dict]) -> torch.Tensor:
        draws = [s["RandomPhotometricDistort"] for s in samples]
        # (adjustment, None or whether it runs where the contrast goes first)
        steps = [("brightness", None), ("contrast", True), ("saturation", None), ("hue", None), ("contrast", False)]
        for name, before in steps:
            rows = [i for i, d in enumerate(draws)
                    if d[name] is not None and (before is None or d["contrast_before"] == before)]
            f = _per_sample([draws[i][name] for i in rows], x) if rows else None
            x = apply_to_rows(x, rows, lambda part: _APPLY[name](part, f))
        rows = [i for i, d in enumerate(draws) if d["channels"] is not None]
        if rows:
            order = torch.tensor([draws[i]["channels"] for i in rows]).to(x.device, non_blocking=True).view(-1, 3, 1, 1)
            x = apply_to_rows(x, rows, lambda part: part.gather(1, order.expand_as(part)))
        return x
