"""Segmentation masks follow their image: each sample's "mask" ([H, W], a label per pixel) and
"masks" ([N, H, W], one per box) are warped in the worker by the sample's matrix to the output size,
nearest-neighbour (labels are never blended), with 0 where the warp leaves the image."""
from __future__ import annotations

from typing import List

import torch

from ..common import ArgumentError
from ._items import INSTANCE_MASK_KEYS, MASK_KEYS


def _warp_one(mask: torch.Tensor, M: torch.Tensor, size) -> torch.Tensor:
    """[..., H, W] -> [..., h, w] by the forward matrix M [2, 3], nearest, border 0, dtype kept."""
    from ..warpaffine import warp_affine

    lead = mask.shape[:-2]
    if mask.numel() == 0:  # an image with no objects: [0, H, W] instance masks (the warp needs a channel)
        return torch.zeros((*lead, *size), dtype=mask.dtype)
    x = mask.reshape(1, -1, *mask.shape[-2:])
    kind = x.dtype
    if kind != torch.uint8:  # integer labels travel as float32: exact below 2**24
        x = x.to(torch.float32)
    out = warp_affine(x, M.unsqueeze(0), (size[1], size[0]), interpolation="nearest", border_value=0,
                      input_layout="NCHW")
    return out.to(kind).reshape(*lead, *size)


def warp_masks(targets: List[dict], M: torch.Tensor, size, image_sizes, indices, errors) -> None:
    """Each sample's masks warped in place of the originals (the targets are the worker's copies).
    A sample whose image is bad (errors[b]) gets zeros of the output size: it leaves the batch later,
    and its masks must still stack with the others' until then."""
    for b, target in enumerate(targets):
        for k in MASK_KEYS + INSTANCE_MASK_KEYS:
            if k not in target:
                continue
            mask = torch.as_tensor(target[k])
            if errors[b]:
                target[k] = torch.zeros((*mask.shape[:-2], *size), dtype=mask.dtype)
                continue
            if tuple(mask.shape[-2:]) != tuple(image_sizes[b]):
                raise ArgumentError(f"GPULoader: sample {indices[b]}: {k!r} is {tuple(mask.shape[-2:])}, its image "
                                    f"{tuple(image_sizes[b])} (height, width)")
            target[k] = _warp_one(mask, M[b], size)
