"""Face alignment as a transform of the composed matrix: each sample's 5 landmarks onto the ArcFace
template, as orbbec.warpaffine.align_faces (and insightface's norm_crop) place them."""
from __future__ import annotations

import numpy as np
import torch

from ..warpaffine import arcface_template
from ..warpaffine._matrices import similarity_in_closed_form
from ._geometry import _IDENTITY, scale_region
from ._targets import stacked_arrays


class AlignFaces:
    """Similarity transform (Umeyama) of the sample's `landmarks` ([5, 2]: eyes, nose, mouth corners,
    in pixels with pixel centres at integers, as face detectors and cv2 give them) onto the ArcFace
    template of size x size. A sample whose landmarks are not finite or all coincide gets the whole
    image resized to size x size instead, and `valid: False` in its drawn parameters; the other samples
    are unaffected."""
    needs_target = True

    def __init__(self, size: int = 112, key: str = "landmarks"):
        self.size, self.key = int(size), key
        self.template = arcface_template(self.size, dtype=torch.float64).numpy()

    def _landmarks(self, target):
        """The sample's landmarks as [5, 2] float64, or None when they are missing or not 5 points."""
        lm = None if target is None else target.get(self.key)
        pts = None if lm is None else np.asarray(lm, dtype=np.float64).reshape(-1, 2)
        return pts if pts is not None and pts.shape == (5, 2) else None

    def fit_batch(self, targets):
        """Every sample's similarity matrix ([3, 3]) in one batched estimate (per sample, the estimate
        and the checks cost a DataLoader worker more than the rest of its batch); None where the
        landmarks are unusable (not finite, or all coinciding). Bit-identical to estimating each alone."""
        fits = [None] * len(targets)
        stack = stacked_arrays([None if t is None else t.get(self.key) for t in targets])
        if stack is not None and stack.shape[1:] == (5, 2):  # every sample's landmarks an array [5, 2]
            have, stack = list(range(len(targets))), stack.astype(np.float64)
        else:
            pts = [self._landmarks(t) for t in targets]
            have = [k for k, p in enumerate(pts) if p is not None]
            if not have:
                return fits
            stack = np.stack([pts[k] for k in have])
        with np.errstate(invalid="ignore"):
            usable = np.isfinite(stack).all(axis=(1, 2)) & (np.ptp(stack, axis=1).max(axis=1) >= 1e-6)
        ok = [k for k, u in zip(have, usable) if u]
        if ok:
            m = np.zeros((len(ok), 3, 3))
            src = stack[usable]
            m[:, :2] = similarity_in_closed_form(np, src, np.broadcast_to(self.template, src.shape))
            m[:, 2, 2] = 1.0
            for j, k in enumerate(ok):
                fits[k] = m[j]
        return fits

    def __call__(self, rng, size, target, fit=None):
        """`fit`: this sample's matrix from fit_batch, if it was computed with the batch."""
        if fit is None:
            fit = self.fit_batch([target])[0]
        return self.matrix(fit, size[0], size[1]), (self.size, self.size), {"valid": fit is not None}

    def matrix(self, fit, h: int, w: int):
        """A sample's matrix (see matrices)."""
        return self.matrices([fit], np.array([h]), np.array([w]))[0]

    def matrices(self, fits, h: np.ndarray, w: np.ndarray) -> np.ndarray:
        """Every sample's matrix [n, 3, 3]: its fit_batch matrix, or where that is None the whole
        h[k] x w[k] image resized to size x size."""
        m = np.stack([f if f is not None else _IDENTITY for f in fits])
        lost = np.array([f is None for f in fits])
        if lost.any():
            zero = np.zeros(int(lost.sum()))
            m[lost] = scale_region(zero, zero, w[lost], h[lost], (self.size, self.size))
        return m
