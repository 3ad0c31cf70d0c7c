"""A batch's parameters drawn for all its samples at once, for the chains that allow it: an optional
RandomResizedCrop, AlignFaces or RandomAffine first, then flips (classification's, face
recognition's and detection's usual augmentation).

The numbers are those of drawing sample by sample (Compose.draw's loop, which stays the reference):
each sample's Philox words come from orbbec._C.philox_streams (numpy's Philox with the same key) and
go through numpy's own conversions (next_double; Lemire's bounded integers on 32-bit halves), so only
the per-sample Python and numpy call overheads go (a DataLoader worker's batch of 128 spent about
1 ms of its 2.3 in them on the development machine). A sample whose draw would read past the words
read here, or meet a bounded integer that numpy would draw again (Lemire's rejection, rarer than one
in a million), is marked to be drawn again one by one. The composed matrices are the products the
loop computes: a flip's products are exact (entries -1, 0, 1 and whole numbers), so the result does
not depend on how numpy's matrix product orders or fuses them."""
from __future__ import annotations

import math
from typing import Dict, Optional

import numpy as np

from ._columns import SampleColumns
from ._faces import AlignFaces
from ._geometry import (_IDENTITY, RandomAffine, RandomHorizontalFlip, RandomResizedCrop, RandomVerticalFlip,
                        affine_entries, flip_matrices, scale_region)
from ._random import index_word, uniform_of_unit

_BATCHED = (RandomResizedCrop, AlignFaces, RandomAffine, RandomHorizontalFlip, RandomVerticalFlip)
_FIRST_ONLY = (RandomResizedCrop, AlignFaces, RandomAffine)  # their matrices times an earlier step's are inexact

WORDS = 24  # 64-bit words per sample: RandomResizedCrop's 10 tries take 20, its position 1, each flip 1
_MASK32 = np.uint64(0xFFFFFFFF)
_TO_DOUBLE = 1.0 / 9007199254740992.0  # numpy's next_double: (word >> 11) * 2**-53


class Streams:
    """Each sample's Philox words with a read position, numpy Generator's draws on rows of samples."""

    def __init__(self, indices, run_key: int, words: int):
        from .. import _C

        keys = np.array([index_word(i) for i in indices], dtype=np.uint64)
        self.raw = _C.philox_streams(keys, run_key, words)
        n = len(keys)
        self.pos = np.zeros(n, np.int64)
        self.has32 = np.zeros(n, bool)       # numpy's buffered upper half of a word (next_uint32)
        self.upper = np.zeros(n, np.uint64)
        self.redo = np.zeros(n, bool)        # samples to draw again one by one

    def _words(self, rows):
        pos = self.pos[rows]
        last = self.raw.shape[1] - 1
        self.redo[rows[pos > last]] = True
        self.pos[rows] = pos + 1
        return self.raw[rows, np.minimum(pos, last)]

    def doubles(self, rows) -> np.ndarray:
        """rng.random() for each sample of rows."""
        return (self._words(rows) >> np.uint64(11)).astype(np.float64) * _TO_DOUBLE

    def _uint32(self, rows) -> np.ndarray:
        has = self.has32[rows]
        out = np.empty(len(rows), np.uint64)
        out[has] = self.upper[rows[has]]
        fresh = rows[~has]
        if len(fresh):
            w = self._words(fresh)
            out[~has] = w & _MASK32
            self.upper[fresh] = w >> np.uint64(32)
        self.has32[rows] = ~has
        return out

    def integers(self, rows, n) -> np.ndarray:
        """rng.integers(0, n) for each sample of rows (n >= 1 per row): no draw where n is 1."""
        out = np.zeros(len(rows), np.int64)
        draw = n > 1
        self.redo[rows[n >= 2 ** 32]] = True  # (numpy's other paths; no image is that large)
        r = rows[draw]
        if len(r):
            bound = n[draw].astype(np.uint64)
            m = self._uint32(r) * bound  # < 2**64
            self.redo[r[(m & _MASK32) < bound]] = True  # where numpy may draw again
            out[draw] = (m >> np.uint64(32)).astype(np.int64)
        return out


def _crop_batch(t: RandomResizedCrop, streams: Streams, rows, h, w):
    """RandomResizedCrop.region for every sample of rows: (x, y, cw, ch) arrays."""
    n = len(rows)
    x, y, cw, ch = (np.zeros(n, np.int64) for _ in range(4))
    area = h * w
    (s0, s1), (l0, l1) = t.scale, t.log_ratio
    pending = np.arange(n)
    for _ in range(10):
        if not len(pending):
            break
        r = rows[pending]
        target = area[pending] * (s0 + (s1 - s0) * streams.doubles(r))
        # math.exp as the loop calls it: numpy's vectorised exp may differ in the last bit
        aspect = np.array([math.exp(v) for v in (l0 + (l1 - l0) * streams.doubles(r)).tolist()])
        cwp = np.rint(np.sqrt(target * aspect)).astype(np.int64)  # round() halves to even, as rint
        chp = np.rint(np.sqrt(target / aspect)).astype(np.int64)
        ok = (cwp > 0) & (cwp <= w[pending]) & (chp > 0) & (chp <= h[pending])
        hit = pending[ok]
        cw[hit], ch[hit] = cwp[ok], chp[ok]
        x[hit] = streams.integers(rows[hit], w[hit] - cw[hit] + 1)
        y[hit] = streams.integers(rows[hit], h[hit] - ch[hit] + 1)
        pending = pending[~ok]
    for k in pending.tolist():  # ten misses: the central crop
        x[k], y[k], cw[k], ch[k] = t.central(int(h[k]), int(w[k]))
    return x, y, cw, ch


def _flip(m: np.ndarray, flipped: np.ndarray, horizontal: bool, extent: np.ndarray) -> np.ndarray:
    """The flip's matrix (the identity where not flipped) times m, for every sample. The products are
    exact (entries -1, 0, 1 and whole numbers), so numpy's matmul gives the loop's bits however its
    BLAS orders or fuses them."""
    f = np.tile(_IDENTITY, (len(flipped), 1, 1))
    rows = np.flatnonzero(flipped)
    f[rows] = flip_matrices(horizontal, extent[rows])
    return np.matmul(f, m)


def batched_chain(geometric) -> Optional[list]:
    """The transforms if drawing them for a batch at once gives the loop's numbers, else None."""
    if not geometric or any(type(t) not in _BATCHED for t in geometric):  # (a subclass may draw otherwise)
        return None
    if any(type(t) in _FIRST_ONLY for t in geometric[1:]):
        return None  # a crop or an alignment after a flip: inexact products, whose rounding numpy's BLAS decides
    return list(geometric)


def _uniform(streams: Streams, rows, low, high):
    """_random.uniform for each sample of rows (the same operations)."""
    return uniform_of_unit(low, high, streams.doubles(rows))


def _affine_batch(t: RandomAffine, streams: Streams, rows, h, w):
    """RandomAffine for every sample of rows: ([n, 3, 3], its parameters' columns by name), the draws
    in RandomAffine.__call__'s order and the matrix by affine_entries, as the loop makes them."""
    angle = _uniform(streams, rows, *t.degrees)
    tx = ty = np.zeros(len(rows))
    if t.translate is not None:
        # round() halves to even, as rint; + 0.0 turns rint's -0.0 into round's 0.0
        tx = np.rint(_uniform(streams, rows, -t.translate[0] * w, t.translate[0] * w)) + 0.0
        ty = np.rint(_uniform(streams, rows, -t.translate[1] * h, t.translate[1] * h)) + 0.0
    s = _uniform(streams, rows, *t.scale) if t.scale is not None else np.ones(len(rows))
    shx, shy = _uniform(streams, rows, *t.shear[0]), _uniform(streams, rows, *t.shear[1])
    entries = affine_entries((w - 1) / 2.0, (h - 1) / 2.0, angle, tx, ty, s, shx, shy)
    m = np.zeros((len(rows), 3, 3))
    m[:, 0, 0], m[:, 0, 1], m[:, 0, 2], m[:, 1, 0], m[:, 1, 1], m[:, 1, 2] = entries
    m[:, 2, 2] = 1.0
    # (the loop's names in its order; float64 columns read back as the loop's Python floats)
    columns = {"angle": ("scalar", angle), "translate": ("tuple", np.stack([tx, ty], 1)), "scale": ("scalar", s),
               "shear": ("tuple", np.stack([shx, shy], 1))}
    return m, columns


def draw_batch(chain: list, sizes, indices, run_key: int, fits=None):
    """(matrices [n, 2, 3] float64, output (h, w) per sample, the per-sample parameters (SampleColumns:
    the loop's dicts, kept as columns), rows to draw again one by one) of `chain` (batched_chain's)
    for images of `sizes`; `fits`: AlignFaces.fit_batch's matrices by id of the transform
    (Compose.draw makes them)."""
    n = len(indices)
    streams = Streams(indices, run_key, WORDS)
    rows = np.arange(n)
    h = np.array([int(s[0]) for s in sizes], np.int64)
    w = np.array([int(s[1]) for s in sizes], np.int64)
    m: Optional[np.ndarray] = None
    columns: Dict[str, tuple] = {}  # the loop's dict keys, in its order -> (kind, column)
    for t in chain:
        name = type(t).__name__ + "."
        if isinstance(t, RandomResizedCrop):
            x, y, cw, ch = _crop_batch(t, streams, rows, h, w)
            m = scale_region(x, y, cw, ch, t.size)
            h, w = np.full(n, t.size[0], np.int64), np.full(n, t.size[1], np.int64)
            columns[name + "crop"] = ("tuple", np.stack([x, y, cw, ch], 1))
        elif isinstance(t, RandomAffine):
            m, drawn = _affine_batch(t, streams, rows, h, w)
            columns.update((name + k, v) for k, v in drawn.items())
        elif isinstance(t, AlignFaces):
            fit = (fits or {}).get(id(t)) or [None] * n
            m = t.matrices(fit, h, w)
            h, w = np.full(n, t.size, np.int64), np.full(n, t.size, np.int64)
            columns[name + "valid"] = ("scalar", np.array([f is not None for f in fit], bool))
        else:
            flipped = streams.doubles(rows) < t.p
            # (a first flip times the identity is the flip's matrix exactly, as the loop takes it)
            m = _flip(np.broadcast_to(_IDENTITY, (n, 3, 3)) if m is None else m, flipped, t.horizontal,
                      w if t.horizontal else h)
            columns[name + t.key] = ("scalar", flipped)
    out = [(int(a), int(b)) for a, b in zip(h.tolist(), w.tolist())]
    return m[:, :2], out, SampleColumns(columns, n), np.flatnonzero(streams.redo).tolist()
