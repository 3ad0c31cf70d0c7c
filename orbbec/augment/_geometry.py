"""Geometric transforms composed into one affine matrix per sample.

Conventions (those of cv2.warpAffine and orbbec.warpaffine): a matrix maps input pixel positions to
output pixel positions, pixel centres at integer coordinates. Every transform sees the image size left
by the transforms before it and returns its matrix and the size it leaves; `Compose` multiplies them.
Names and argument meanings follow torchvision.transforms.v2 where they exist.
"""
from __future__ import annotations

import functools
import math
from typing import Sequence, Tuple, Union

import numpy as np
from ..common import ArgumentError
from ._random import uniform

Size = Tuple[int, int]  # (height, width)


def _pair(v, name) -> Size:
    if isinstance(v, int):
        return (v, v)
    v = tuple(int(x) for x in v)
    if len(v) != 2 or min(v) <= 0:
        raise ArgumentError(f"{name}: expected an int or (height, width) > 0, got {v}")
    return v


def scale_region(x0, y0, w, h, out: Size) -> np.ndarray:
    """The region [x0, x0+w) x [y0, y0+h) (pixel edges) onto an out=(height, width) image: [3, 3], or
    [n, 3, 3] for arrays of n regions (a batch's draws at once, the same arithmetic)."""
    sx, sy = out[1] / w, out[0] / h
    if np.ndim(sx) == 0:
        return np.array([[sx, 0, (0.5 - x0) * sx - 0.5], [0, sy, (0.5 - y0) * sy - 0.5], [0, 0, 1]])
    m = np.zeros((len(sx), 3, 3))
    m[:, 0, 0], m[:, 0, 2] = sx, (0.5 - x0) * sx - 0.5
    m[:, 1, 1], m[:, 1, 2] = sy, (0.5 - y0) * sy - 0.5
    m[:, 2, 2] = 1.0
    return m


def _constant_border(name, fill, padding_mode="constant") -> None:
    """torchvision's fill and padding_mode, taken only where they agree with the one warp's border."""
    if padding_mode != "constant":
        raise ArgumentError(f"{name}: padding_mode {padding_mode!r} is not supported: what lies outside the "
                            "image takes the warp's constant border")
    if fill not in (0, None):
        raise ArgumentError(f"{name}: fill={fill!r} is not taken here: what lies outside the image takes the "
                            "warp's border, GPULoader(border_value=...) or Compose.apply(border_value=...)")


class Resize:
    """torchvision's Resize: an int resizes the smaller edge to it, keeping the aspect ratio; (h, w) is
    exact. Bilinear without antialiasing (cv2.INTER_LINEAR's sampling), where torchvision's tensor
    Resize antialiases by default: strong downscales alias here."""

    def __init__(self, size: Union[int, Sequence[int]]):
        self.size = size

    def __call__(self, rng, size: Size):
        h, w = size
        if isinstance(self.size, int):
            out = (self.size, int(self.size * w / h)) if h <= w else (int(self.size * h / w), self.size)
        else:
            out = _pair(self.size, "Resize.size")
        return scale_region(0, 0, w, h, out), out, {}


class CenterCrop:
    """torchvision's CenterCrop (outside the image: the border fills)."""

    def __init__(self, size):
        self.size = _pair(size, "CenterCrop.size")

    def __call__(self, rng, size: Size):
        (h, w), (ch, cw) = size, self.size
        top, left = int(round((h - ch) / 2.0)), int(round((w - cw) / 2.0))
        return np.array([[1.0, 0, -left], [0, 1.0, -top], [0, 0, 1]]), (ch, cw), {"crop": (left, top, cw, ch)}


class RandomResizedCrop:
    """torchvision's RandomResizedCrop: a region of `scale` of the area and `ratio` of aspect (10
    tries, then the central crop of the clamped ratio), resized to `size`."""

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
        self.size = _pair(size, "RandomResizedCrop.size")
        self.scale, self.ratio = _ordered(scale, "RandomResizedCrop.scale"), _ordered(ratio, "RandomResizedCrop.ratio")
        self.log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))

    def region(self, rng, h, w):
        area = h * w
        for _ in range(10):
            target = area * uniform(rng, self.scale[0], self.scale[1])
            aspect = math.exp(uniform(rng, *self.log_ratio))
            cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
            if 0 < cw <= w and 0 < ch <= h:
                return int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1)), cw, ch
        return self.central(h, w)

    def central(self, h, w):
        """The region after ten misses: the central crop of the ratio clamped to `ratio` (at least a
        pixel: a sliver rounded to none had divided by zero)."""
        in_ratio = w / h
        if in_ratio < min(self.ratio):
            cw, ch = w, max(1, int(round(w / min(self.ratio))))
        elif in_ratio > max(self.ratio):
            cw, ch = max(1, int(round(h * max(self.ratio)))), h
        else:
            cw, ch = w, h
        return (w - cw) // 2, (h - ch) // 2, cw, ch

    def __call__(self, rng, size: Size):
        x, y, cw, ch = self.region(rng, *size)
        return scale_region(x, y, cw, ch, self.size), self.size, {"crop": (x, y, cw, ch)}


def _read_only(m: np.ndarray) -> np.ndarray:
    m.setflags(write=False)
    return m


# A flip's matrices, made once and shared (read-only): a DataLoader worker draws one per sample, and
# making them took a tenth of a face batch's drawing.
_IDENTITY = _read_only(np.eye(3))


def flip_matrices(horizontal: bool, extents) -> np.ndarray:
    """[n, 3, 3] flips of images whose width (horizontal) or height is extents[k]."""
    m = np.tile(_IDENTITY, (len(extents), 1, 1))
    axis = 0 if horizontal else 1
    m[:, axis, axis] = -1.0
    m[:, axis, 2] = np.asarray(extents) - 1
    return m


@functools.lru_cache(maxsize=4096)
def _flip_matrix(horizontal: bool, extent: int) -> np.ndarray:
    return _read_only(flip_matrices(horizontal, [extent])[0])


class _RandomFlip:
    horizontal = True

    def __init__(self, p: float = 0.5):
        self.p = p

    def __call__(self, rng, size: Size):
        h, w = size
        flip = rng.random() < self.p  # rng.uniform()'s draw, at a third of its cost
        if not flip:
            return _IDENTITY, size, {self.key: False}
        return _flip_matrix(self.horizontal, w if self.horizontal else h), size, {self.key: True}


class RandomHorizontalFlip(_RandomFlip):
    horizontal, key = True, "hflip"


class RandomVerticalFlip(_RandomFlip):
    horizontal, key = False, "vflip"


def _range(v, name, center=0.0):
    if v is None:
        return (center, center)
    if isinstance(v, (int, float)):
        if v < 0:
            raise ArgumentError(f"{name}: must be >= 0, got {v}")
        return (center - v, center + v)
    return _ordered(v, name)


def _ordered(v, name) -> Tuple[float, float]:
    """A (min, max) pair, refused when inverted (torchvision's draw would fail there, at the first sample)."""
    low, high = float(v[0]), float(v[1])
    if low > high:
        raise ArgumentError(f"{name}: expected (min, max), got ({low}, {high})")
    return low, high


class RandomAffine:
    """torchvision's RandomAffine parameters: rotation angle uniform in `degrees` (clockwise, as
    torchvision's affine turns the image),
    translation uniform in +-translate * size (rounded to pixels), `scale` uniform, shear angles in
    degrees along x (and y when four numbers are given), about the image centre; the size is kept."""

    def __init__(self, degrees, translate=None, scale=None, shear=None):
        self.degrees = _range(degrees, "RandomAffine.degrees")
        self.translate = translate
        self.scale = None if scale is None else _ordered(scale, "RandomAffine.scale")
        if shear is None or isinstance(shear, (int, float)) or len(shear) == 2:
            self.shear = (_range(shear, "RandomAffine.shear"), (0.0, 0.0))
        else:
            self.shear = (_ordered(shear[:2], "RandomAffine.shear (x)"), _ordered(shear[2:], "RandomAffine.shear (y)"))

    def __call__(self, rng, size: Size):
        h, w = size
        angle = uniform(rng, *self.degrees)
        tx = ty = 0.0
        if self.translate is not None:
            tx = float(round(uniform(rng, -self.translate[0] * w, self.translate[0] * w)))
            ty = float(round(uniform(rng, -self.translate[1] * h, self.translate[1] * h)))
        s = uniform(rng, *self.scale) if self.scale is not None else 1.0
        shx, shy = uniform(rng, *self.shear[0]), uniform(rng, *self.shear[1])
        m = affine_matrix(((w - 1) / 2.0, (h - 1) / 2.0), angle, (tx, ty), s, (shx, shy))
        return m, size, {"angle": angle, "translate": (tx, ty), "scale": s, "shear": (shx, shy)}


def affine_matrix(centre, angle: float, translate=(0.0, 0.0), scale: float = 1.0, shear=(0.0, 0.0)) -> np.ndarray:
    """torchvision's affine as a forward matrix: R(angle) S(scale) SHy(shear_y) SHx(shear_x) about
    `centre` (pixel centres at integers), the angle clockwise on the screen (y points down), then
    the translation. Angles in degrees."""
    rows = affine_entries(centre[0], centre[1], angle, float(translate[0]), float(translate[1]), float(scale),
                          shear[0], shear[1])
    return np.array([rows[:3], rows[3:], [0.0, 0.0, 1.0]])


def _each(f, v):
    """math's f of a float, or of each value of an array (numpy's vectorised functions may differ
    from math's in the last bit)."""
    return f(v) if np.ndim(v) == 0 else np.array([f(x) for x in np.asarray(v).tolist()])


def affine_entries(cx, cy, angle, tx, ty, scale, shear_x, shear_y) -> tuple:
    """The top two rows of affine_matrix, entry by entry (angles in degrees): floats for one sample
    or arrays for a batch (orbbec/augment/_batched.py), the same operations in the same order either
    way, so both give the same bits (no matrix product, whose rounding numpy's BLAS would decide).
    R @ SHy @ SHx, times the scale, about the centre."""
    a = _each(math.radians, angle)
    cos_a, sin_a = _each(math.cos, a), _each(math.sin, a)
    tan_x, tan_y = (_each(lambda d: math.tan(math.radians(d)), v) for v in (shear_x, shear_y))
    a00 = (cos_a + sin_a * tan_y) * scale
    a01 = (-(cos_a * tan_x) - sin_a * (tan_y * tan_x + 1.0)) * scale
    a10 = (sin_a - cos_a * tan_y) * scale
    a11 = (-(sin_a * tan_x) + cos_a * (tan_y * tan_x + 1.0)) * scale
    return (a00, a01, (cx + tx) - (a00 * cx + a01 * cy),
            a10, a11, (cy + ty) - (a10 * cx + a11 * cy))


class RandomRotation:
    """torchvision's RandomRotation (expand=False): the image turned counter-clockwise by an angle
    uniform in `degrees` (torchvision's rotate turns the other way from its affine) about its centre
    or `center` (x, y; pixel edges, origin at the top-left corner, as torchvision takes it). Bilinear
    like every transform of the one warp, where torchvision's default is nearest."""

    def __init__(self, degrees, expand: bool = False, center=None, fill=0):
        if expand:
            raise ArgumentError("RandomRotation: expand=True is not supported (follow with Resize or a crop "
                                "to choose the output size)")
        _constant_border("RandomRotation", fill)
        self.degrees, self.center = _range(degrees, "RandomRotation.degrees"), center

    def __call__(self, rng, size: Size):
        h, w = size
        angle = uniform(rng, *self.degrees)
        centre = ((w - 1) / 2.0, (h - 1) / 2.0) if self.center is None else \
            (self.center[0] - 0.5, self.center[1] - 0.5)
        return affine_matrix(centre, -angle), size, {"angle": angle}
