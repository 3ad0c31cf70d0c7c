"""Face alignment as a transform of the composed matrix: each sample's 5 landmarks onto the ArcFace
template, as orbbec.warpaffine.align_faces (and insightface's norm_crop) place them."""
from __future__ import annotations

import numpy as np
import torch

from ..warpaffine import arcface_template, estimate_similarity
from ._geometry import scale_region


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

    def __call__(self, rng, size, target):
        out = (self.size, self.size)
        lm = None if target is None else target.get(self.key)
        pts = None if lm is None else np.asarray(lm, dtype=np.float64).reshape(-1, 2)
        if pts is None or pts.shape != (5, 2) or not np.isfinite(pts).all() or np.ptp(pts, axis=0).max() < 1e-6:
            return scale_region(0, 0, size[1], size[0], out), out, {"valid": False}
        m = estimate_similarity(torch.from_numpy(pts), torch.from_numpy(self.template)).numpy()
        return np.vstack([m, [0.0, 0.0, 1.0]]), out, {"valid": True}
