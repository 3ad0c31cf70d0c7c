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
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from ._color import ColorJitter, RandomGrayscale, RandomPhotometricDistort, apply_photometric, is_photometric
from ._faces import AlignFaces
from ._canvas import Pad, RandomCrop, RandomIoUCrop, RandomShortestSize, RandomZoomOut, ScaleJitter
from ._geometry import (CenterCrop, RandomAffine, RandomHorizontalFlip, RandomResizedCrop, RandomRotation,
                        RandomVerticalFlip, Resize)
from ._erasing import RandomErasing
from ._policies import RandAugment, TrivialAugmentWide, is_policy
from ._batched import batched_chain, draw_batch
from ._random import SampleRngs, sample_rng
from ._targets import enclosing_boxes, transform_boxes, transform_keypoints, transform_landmarks
from ..common import ArgumentError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
BATCH_DRAW_MIN = 4  # samples from which a batch_chain's draws are made for the batch at once (_batched.py)

__all__ = ["Compose", "Normalize", "Params", "Resize", "CenterCrop", "RandomResizedCrop", "RandomAffine",
           "RandomRotation", "RandomCrop", "Pad", "RandomZoomOut", "RandomIoUCrop", "ScaleJitter",
           "RandomShortestSize", "RandomHorizontalFlip", "RandomVerticalFlip", "TrivialAugmentWide", "RandAugment",
           "RandomErasing", "AlignFaces", "ColorJitter", "RandomGrayscale", "Grayscale", "RandomPhotometricDistort",
           "sample_rng", "transform_boxes", "transform_keypoints", "transform_landmarks", "IMAGENET_MEAN",
           "IMAGENET_STD"]


class Grayscale(RandomGrayscale):
    """torchvision's Grayscale(num_output_channels=3): the luma in all three channels, always."""

    def __init__(self, num_output_channels: int = 3):
        if num_output_channels != 3:
            raise ValueError("Grayscale: only num_output_channels=3 is supported (the batch keeps 3 channels)")
        super().__init__(p=1.0)


class Normalize:
    """torchvision's ToDtype(float32, scale=True) then Normalize(mean, std): (v / 255 - mean) / std,
    fused into the warp."""

    def __init__(self, mean, std, scale: float = 1 / 255):
        self.mean, self.std, self.scale = tuple(mean), tuple(std), scale


@dataclass
class Params:
    """What was drawn for a batch: forward matrices [B, 2, 3] (input pixel -> output pixel, float64),
    the output (height, width), and each sample's parameters by transform: a dict per sample, in a
    list, or, where the draws were made for the whole batch at once, in a read-only sequence kept as
    columns that reads, compares and prints as that list (list(params.samples) gives the list)."""
    matrices: torch.Tensor
    size: Tuple[int, int]
    samples: Sequence[dict] = field(default_factory=list)


class Compose:
    """Geometric transforms (composed into one matrix per sample), then photometric ones (ColorJitter,
    RandomGrayscale: on the float batch after the warp), then Normalize (fused into the warp when no
    photometric transform comes between)."""

    def __init__(self, transforms: Sequence):
        transforms = list(transforms)
        # RandomErasing works on the finished batch: last, after Normalize, as in torchvision's recipes.
        self.erasing = [t for t in transforms if isinstance(t, RandomErasing)]
        if len(self.erasing) > 1 or (self.erasing and transforms[-1] is not self.erasing[0]):
            raise ArgumentError("Compose: RandomErasing, if given, must be the last transform (after Normalize)")
        transforms = transforms[:-1] if self.erasing else transforms
        norms = [t for t in transforms if isinstance(t, Normalize)]
        if len(norms) > 1 or (norms and transforms[-1] is not norms[0]):
            raise ArgumentError("Compose: Normalize, if given, must be the last transform (it is fused into the "
                                "warp), or come just before RandomErasing")
        self.normalize: Optional[Normalize] = norms[0] if norms else None
        self.photometric = [t for t in transforms if is_photometric(t)]
        # A policy (TrivialAugmentWide, RandAugment) is both: its ops join the matrix or the colours.
        self.geometric = [t for t in transforms
                          if (is_policy(t) or not is_photometric(t)) and not isinstance(t, Normalize)]
        first_photo = next((i for i, t in enumerate(transforms) if is_photometric(t)), len(transforms))
        if any(not is_photometric(t) and not isinstance(t, Normalize) for t in transforms[first_photo:]):
            raise ValueError("Compose: geometric transforms must come before ColorJitter/RandomGrayscale "
                             "(the geometry is one warp; colour works on its output)")
        names = [type(t).__name__ for t in self.photometric]
        if len(set(names)) != len(names):
            raise ValueError(f"Compose: each photometric transform may appear once, got {names}")
        # Chains whose draws can be made for a whole batch at once (the same numbers, less Python)
        self._batch_chain = None if self.photometric or self.erasing else batched_chain(self.geometric)

    def draw(self, sizes: Sequence[Tuple[int, int]], indices: Sequence[int], *, epoch: int = 0,
             seed: int = 0, targets: Optional[Sequence[Optional[dict]]] = None) -> Params:
        """Parameters for images of the given (height, width), sample indices `indices`. `targets`
        (one dict per sample, or None) feeds transforms that need them (AlignFaces: "landmarks")."""
        if len(sizes) != len(indices):
            raise ArgumentError(f"Compose.draw: {len(sizes)} sizes but {len(indices)} indices")
        if targets is not None and len(targets) != len(sizes):
            raise ArgumentError(f"Compose.draw: {len(sizes)} sizes but {len(targets)} targets")
        # Transforms that fit something to the targets (AlignFaces) do it for the whole batch at once.
        fits = {id(t): t.fit_batch(targets if targets is not None else [None] * len(sizes))
                for t in self.geometric if hasattr(t, "fit_batch")}
        rngs = SampleRngs(seed, epoch)
        # What each transform is called with, decided once per batch rather than per sample (this
        # loop is most of a face batch's time in a DataLoader worker).
        steps = [(t, type(t).__name__ + ".", fits.get(id(t)), getattr(t, "needs_target", False),
                  getattr(t, "needs_boxes", False)) for t in self.geometric]
        colour = [(type(t).__name__, t) for t in self.photometric if not is_policy(t)]

        def one(k):
            return self._draw_one(rngs.for_index(indices[k]), sizes[k], k, targets, steps, colour)
        if self._batch_chain is not None and len(indices) >= BATCH_DRAW_MIN:
            mats, outs, samples, redo = draw_batch(self._batch_chain, sizes, indices, rngs.run_key, fits)
            if redo:  # (rare: the columns' dicts made, the redrawn samples put in)
                samples = list(samples)
            for k in redo:
                mats[k], outs[k], samples[k] = one(k)
        else:
            drawn = [one(k) for k in range(len(indices))]
            mats, outs, samples = [d[0] for d in drawn], [d[1] for d in drawn], [d[2] for d in drawn]
        out = outs[0] if outs else None
        for size, index in zip(outs, indices):
            if size != out:
                raise ArgumentError(f"Compose: sample {index} comes out {size}, sample {indices[0]} {out}; end the "
                                    "transforms with a fixed size (RandomResizedCrop(size), Resize((h, w)), "
                                    "CenterCrop, RandomCrop(size, pad_if_needed=True))")
        # from_numpy on the fresh array: torch.tensor copied it again (a batch of 64: 11 against 4 us)
        return Params(torch.from_numpy(np.array(mats, dtype=np.float64).reshape(-1, 2, 3)), out, samples)

    def _draw_one(self, rng, hw, k: int, targets, steps, colour):
        """(matrix [2, 3], output size, parameters) of sample k of a batch, drawn from its rng."""
        m, size, info = None, (int(hw[0]), int(hw[1])), {}
        for t, name, fit, needs_target, needs_boxes in steps:
            if fit is not None:
                step, size, p = t(rng, size, None if targets is None else targets[k], fit[k])
            elif needs_target:
                step, size, p = t(rng, size, None if targets is None else targets[k])
            elif needs_boxes:  # the sample's boxes where the steps so far moved them
                boxes = None if targets is None or targets[k] is None else targets[k].get("boxes")
                if boxes is not None:
                    boxes = enclosing_boxes(boxes, (m if m is not None else np.eye(3))[:2]).numpy()
                step, size, p = t(rng, size, boxes)
            else:
                step, size, p = t(rng, size)
            m = step if m is None else step @ m
            for key, v in p.items():
                info[name + key] = v
        if m is None:
            m = np.eye(3)
        for cname, t in colour:  # (a policy drew its colour ops with its geometric ones)
            info[cname] = t.draw(rng)
        for t in self.erasing:
            info[type(t).__name__] = t.draw_at(rng, size)
        return m[:2], size, info

    def warp_options(self) -> dict:
        """warp_affine's output arguments of this transform's warp (a list in, NCHW out): the fused
        normalisation when no photometric transform comes between, else float in [0, 1]."""
        n = self.normalize
        if not self.photometric:
            return dict(out_dtype=torch.float32, mean=n.mean, std=n.std, scale=n.scale) if n is not None else {}
        return dict(out_dtype=torch.float32, scale=n.scale if n is not None else 1 / 255)

    def apply(self, images, params: Params, *, border_value=0) -> torch.Tensor:
        """Warps images (a list of HWC uint8 tensors, or an NCHW batch) by params, in one call; then the
        photometric transforms and the normalisation."""
        from ..warpaffine import warp_affine

        is_list = isinstance(images, (list, tuple))
        M = params.matrices.to(images[0].device if is_list else images.device, non_blocking=True)
        dsize = (params.size[1], params.size[0])
        options = self.warp_options()
        x = warp_affine(images, M, dsize, border_value=border_value,
                        out_layout="NCHW" if (is_list or options) else None, **options)
        return self.after_warp(x, params)

    def after_warp(self, x: torch.Tensor, params: Params) -> torch.Tensor:
        """What follows the warp (of apply, or of the loader's warp in the decoder): the photometric
        transforms and the normalisation, when not fused into the warp; then RandomErasing."""
        if self.photometric:
            x = apply_photometric(x, params.samples, self.photometric)
            n = self.normalize
            if n is not None:
                mean = torch.tensor(n.mean, dtype=x.dtype).to(x.device, non_blocking=True).view(1, -1, 1, 1)
                std = torch.tensor(n.std, dtype=x.dtype).to(x.device, non_blocking=True).view(1, -1, 1, 1)
                x = x.sub_(mean).div_(std)
        for t in self.erasing:
            x = t.apply_batch(x, [s[type(t).__name__]["erase"] for s in params.samples])
        return x
