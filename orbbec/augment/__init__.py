"""orbbec.augment: per-sample random geometric augmentation, composed into one affine matrix per
sample and applied to a whole batch by one orbbec.warpaffine call (with the normalisation fused in).

    aug = Compose([RandomResizedCrop(224), RandomHorizontalFlip(), Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    params = aug.draw([img.shape[:2] for img in images], indices, epoch=epoch, seed=seed)
    batch = aug.apply(images, params)          # [B, 3, 224, 224] float32, normalised
    boxes, kept = transform_boxes(boxes_i, params.matrices[i], params.size)

Each sample's parameters come from (seed, epoch, sample index) alone (orbbec.augment.sample_rng), so
batches do not depend on the number of workers or GPUs, and `params` says what was drawn.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from ._geometry import (CenterCrop, RandomAffine, RandomHorizontalFlip, RandomResizedCrop, RandomVerticalFlip,
                        Resize)
from ._random import sample_rng
from ._targets import transform_boxes, transform_keypoints
from ..common import ArgumentError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

__all__ = ["Compose", "Normalize", "Params", "Resize", "CenterCrop", "RandomResizedCrop", "RandomAffine",
           "RandomHorizontalFlip", "RandomVerticalFlip", "sample_rng", "transform_boxes", "transform_keypoints",
           "IMAGENET_MEAN", "IMAGENET_STD"]


class Normalize:
    """torchvision's ToDtype(float32, scale=True) then Normalize(mean, std): (v / 255 - mean) / std,
    fused into the warp."""

    def __init__(self, mean, std, scale: float = 1 / 255):
        self.mean, self.std, self.scale = tuple(mean), tuple(std), scale


@dataclass
class Params:
    """What was drawn for a batch: forward matrices [B, 2, 3] (input pixel -> output pixel, float64),
    the output (height, width), and each sample's parameters by transform."""
    matrices: torch.Tensor
    size: Tuple[int, int]
    samples: List[dict] = field(default_factory=list)


class Compose:
    def __init__(self, transforms: Sequence):
        self.geometric = [t for t in transforms if not isinstance(t, Normalize)]
        norms = [t for t in transforms if isinstance(t, Normalize)]
        if len(norms) > 1 or (norms and transforms[-1] is not norms[0]):
            raise ArgumentError("Compose: Normalize, if given, must be the last transform (it is fused into the warp)")
        self.normalize: Optional[Normalize] = norms[0] if norms else None

    def draw(self, sizes: Sequence[Tuple[int, int]], indices: Sequence[int], *, epoch: int = 0,
             seed: int = 0) -> Params:
        """Parameters for images of the given (height, width), sample indices `indices`."""
        if len(sizes) != len(indices):
            raise ArgumentError(f"Compose.draw: {len(sizes)} sizes but {len(indices)} indices")
        mats, samples, out = [], [], None
        for (h, w), index in zip(sizes, indices):
            rng = sample_rng(seed, epoch, index)
            m, size, info = np.eye(3), (int(h), int(w)), {}
            for t in self.geometric:
                step, size, p = t(rng, size)
                m = step @ m
                info.update({f"{type(t).__name__}.{k}": v for k, v in p.items()})
            if out is not None and size != out:
                raise ArgumentError(f"Compose: sample {index} comes out {size}, sample {indices[0]} {out}; end the "
                                 "transforms with a fixed size (RandomResizedCrop(size), Resize((h, w)), CenterCrop)")
            out = size
            mats.append(m[:2])
            samples.append(info)
        return Params(torch.tensor(np.array(mats), dtype=torch.float64), out, samples)

    def apply(self, images, params: Params, *, border_value=0) -> torch.Tensor:
        """Warps images (a list of HWC uint8 tensors, or an NCHW batch) by params, in one call."""
        from ..warpaffine import warp_affine

        is_list = isinstance(images, (list, tuple))
        M = params.matrices.to(images[0].device if is_list else images.device)
        dsize = (params.size[1], params.size[0])
        fused = {}
        if self.normalize is not None:
            n = self.normalize
            fused = dict(out_dtype=torch.float32, mean=n.mean, std=n.std, scale=n.scale)
        return warp_affine(images, M, dsize, border_value=border_value,
                           out_layout="NCHW" if (is_list or fused) else None, **fused)
