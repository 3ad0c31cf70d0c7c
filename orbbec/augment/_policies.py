"""TrivialAugmentWide and RandAugment with torchvision.transforms.v2's op spaces, magnitudes and
draws, drawn per sample (torchvision draws one op for a whole batch tensor).

A sample's geometric ops (shear, translate, rotate) join its matrix, so they run in the one warp; its
colour ops run on the float batch after the warp, each op at once for the samples that drew it. The
colour ops follow torchvision's uint8 arithmetic where it quantises (posterize, equalize read the
value the warp would have rounded to), so they match a recipe that augments uint8 images.
"""
from __future__ import annotations

import functools
import math
from typing import List, Tuple

import numpy as np
import torch

from ..common import ArgumentError
from ._color import adjust_brightness, adjust_contrast, adjust_saturation, apply_to_rows
from ._geometry import Size, affine_matrix

GEOMETRIC_OPS = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")


@functools.lru_cache(maxsize=64)
def _op_space(ranges: tuple, num_bins: int, h: int, w: int) -> dict:
    """A policy's ops: name -> (magnitudes by bin or None, signed), from its ranges (shear, translation
    as a share of the size or in pixels, rotation, colour factor, posterize steps). Cached: a worker
    asks for it for every sample."""
    shear, translate, relative, rotate, colour, steps = ranges
    lin = lambda hi, lo=0.0: np.linspace(lo, hi, num_bins, dtype=np.float32)  # torch.linspace's float32 values
    tx, ty = (translate * w, translate * h) if relative else (translate, translate)
    posterize = np.round(8 - np.arange(num_bins) / ((num_bins - 1) / steps)).astype(int)
    return {"Identity": (None, False), "ShearX": (lin(shear), True), "ShearY": (lin(shear), True),
            "TranslateX": (lin(tx), True), "TranslateY": (lin(ty), True), "Rotate": (lin(rotate), True),
            "Brightness": (lin(colour), True), "Color": (lin(colour), True), "Contrast": (lin(colour), True),
            "Sharpness": (lin(colour), True), "Posterize": (posterize, False), "Solarize": (lin(0.0, 1.0), False),
            "AutoContrast": (None, False), "Equalize": (None, False)}


def op_matrix(name: str, magnitude: float, size: Size) -> np.ndarray:
    """The forward matrix of a geometric op as torchvision applies it: shears about the top-left
    corner (center=[0, 0]), translations by whole pixels, rotations counter-clockwise about the centre."""
    h, w = size
    corner, centre = (-0.5, -0.5), ((w - 1) / 2.0, (h - 1) / 2.0)  # pixel edge (0, 0); the middle
    if name == "ShearX":
        return affine_matrix(corner, 0.0, shear=(math.degrees(math.atan(magnitude)), 0.0))
    if name == "ShearY":
        return affine_matrix(corner, 0.0, shear=(0.0, math.degrees(math.atan(magnitude))))
    if name == "TranslateX":
        return affine_matrix(centre, 0.0, translate=(int(magnitude), 0))
    if name == "TranslateY":
        return affine_matrix(centre, 0.0, translate=(0, int(magnitude)))
    return affine_matrix(centre, -magnitude)  # Rotate


class _Policy:
    """Draws `num_ops` ops per sample; `__call__` gives their geometric part as a matrix and every op in
    the sample's params ("ops": [(name, magnitude), ...]); `apply_colour` runs the colour part."""
    num_ops, fixed_bin, ranges = 1, None, None

    def __init__(self, num_magnitude_bins: int = 31):
        if num_magnitude_bins < 2:
            raise ArgumentError(f"{type(self).__name__}: num_magnitude_bins must be >= 2, got {num_magnitude_bins}")
        self.num_bins = int(num_magnitude_bins)

    def __call__(self, rng, size: Size):
        h, w = size
        space = _op_space(self.ranges, self.num_bins, h, w)
        names = list(space)
        m, ops = np.eye(3), []
        for _ in range(self.num_ops):
            name = names[int(rng.integers(0, len(names)))]
            magnitudes, signed = space[name]
            magnitude = 0.0
            if magnitudes is not None:
                b = self.fixed_bin if self.fixed_bin is not None else int(rng.integers(0, self.num_bins))
                magnitude = float(magnitudes[b])
                if signed and rng.uniform() <= 0.5:
                    magnitude = -magnitude
            ops.append((name, magnitude))
            if name in GEOMETRIC_OPS:
                m = op_matrix(name, magnitude, size) @ m
        return m, size, {"ops": ops}

    def apply_colour(self, x: torch.Tensor, samples: List[dict]) -> torch.Tensor:
        """x [B, 3, H, W] float in [0, 1]: each sample's colour ops, in its drawn order."""
        ops = [s[type(self).__name__ + ".ops"] for s in samples]
        for slot in range(self.num_ops):
            by_name = {}
            for i, sample_ops in enumerate(ops):
                name, magnitude = sample_ops[slot]
                if name in COLOUR_OPS:
                    by_name.setdefault(name, []).append((i, magnitude))
            for name, rows in by_name.items():
                mags = torch.tensor([v for _, v in rows], dtype=x.dtype).to(x.device, non_blocking=True)
                x = apply_to_rows(x, [i for i, _ in rows], lambda part: COLOUR_OPS[name](part, mags.view(-1, 1, 1, 1)))
        return x


class TrivialAugmentWide(_Policy):
    """torchvision's TrivialAugmentWide: one op per sample, a uniform magnitude bin, signed ops
    negated with probability 1/2. Bilinear (the one warp) where torchvision's default is nearest."""
    ranges = (0.99, 32.0, False, 135.0, 0.99, 6)  # shear, translate (pixels), rotate, colour, posterize steps


class RandAugment(_Policy):
    """torchvision's RandAugment: `num_ops` ops per sample at magnitude bin `magnitude`."""
    ranges = (0.3, 150.0 / 331.0, True, 30.0, 0.9, 4)  # the translation a share of the size

    def __init__(self, num_ops: int = 2, magnitude: int = 9, num_magnitude_bins: int = 31):
        super().__init__(num_magnitude_bins)
        if not 0 <= magnitude < num_magnitude_bins:
            raise ArgumentError(f"RandAugment: magnitude must lie in [0, {num_magnitude_bins}), got {magnitude}")
        self.num_ops, self.fixed_bin = int(num_ops), int(magnitude)


def _levels(x: torch.Tensor) -> torch.Tensor:
    """The uint8 values a rounding warp would have written, as floats."""
    return (x * 255.0).round_().clamp_(0, 255)


def _sharpness(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    # torchvision's: the inner pixels blended with a 3 x 3 smoothing (1s around a 5, over 13); the
    # outermost rows and columns kept. Summed tap by tap rather than by conv2d, whose algorithm (and
    # last bits) may change with the batch's size: a sample's pixels must not depend on its batch.
    h, w = x.shape[-2:]
    ring = sum(x[..., dy:h - 2 + dy, dx:w - 2 + dx] for dy in range(3) for dx in range(3) if (dy, dx) != (1, 1))
    blurred = (ring + 5.0 * x[..., 1:-1, 1:-1]) / 13.0
    out = x.clone()
    inner = out[..., 1:-1, 1:-1]
    inner.add_((blurred - inner) * (1.0 - f))
    return out.clamp_(0, 1)


def _posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    step = torch.pow(2.0, 8.0 - bits)  # keeping `bits` high bits of each uint8 value
    return torch.floor(_levels(x) / step) * step / 255.0


def _solarize(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= threshold, 1.0 - x, x)


def _autocontrast(x: torch.Tensor, _) -> torch.Tensor:
    # Each channel stretched to [0, 1]; a flat channel is kept (offset 0, scale 1), as torchvision does.
    lo, hi = x.amin(dim=(-2, -1), keepdim=True), x.amax(dim=(-2, -1), keepdim=True)
    flat = hi == lo
    return ((x - lo.masked_fill(flat, 0.0)) * (1.0 / (hi - lo).masked_fill(flat, 1.0))).clamp_(0, 1)


def _equalize(x: torch.Tensor, _) -> torch.Tensor:
    """PIL's histogram equalisation per sample and channel on the uint8 levels: lut[v] =
    (cum[v - 1] + step // 2) // step, step = (pixels not of the image's top level) // 255;
    a channel with step 0 is kept."""
    b, c, h, w = x.shape
    v = _levels(x).to(torch.int64).view(b * c, h * w)
    hist = torch.zeros(b * c, 256, dtype=torch.int64, device=x.device).scatter_add_(1, v, torch.ones_like(v))
    cum = hist.cumsum(1)
    top = hist.gather(1, cum.argmax(1, keepdim=True))  # count of the highest level present
    step = (h * w - top) // 255
    lut = torch.cat([torch.zeros_like(step), (cum[:, :-1] + step.clamp(min=1) // 2) // step.clamp(min=1)], 1)
    out = lut.clamp_(0, 255).gather(1, v).to(x.dtype) / 255.0
    return torch.where(step > 0, out, x.reshape(b * c, h * w)).view(b, c, h, w)


COLOUR_OPS = {
    "Brightness": lambda x, m: adjust_brightness(x, 1.0 + m),
    "Color": lambda x, m: adjust_saturation(x, 1.0 + m),
    "Contrast": lambda x, m: adjust_contrast(x, 1.0 + m),
    "Sharpness": lambda x, m: _sharpness(x, 1.0 + m),
    "Posterize": _posterize,
    "Solarize": _solarize,
    "AutoContrast": _autocontrast,
    "Equalize": _equalize,
}


def is_policy(t) -> bool:
    return isinstance(t, _Policy)


__all__: Tuple[str, ...] = ("TrivialAugmentWide", "RandAugment", "is_policy", "op_matrix", "COLOUR_OPS")
