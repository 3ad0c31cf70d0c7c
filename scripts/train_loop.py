#!/usr/bin/env python
"""The training-loop use of orbbec (face recognition, 112 x 112 aligned crops): uint8 images and
5-point landmarks arrive from the DataLoader, are copied to the GPU as uint8, and each batch is
aligned, converted to float and normalised in one warp before the backbone.

    python scripts/train_loop.py [--steps 5] [--batch 64]

Runs on the CPU where there is no GPU. The data are the sample photographs with synthetic landmarks.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from workloads import photos_bgr  # noqa: E402

from orbbec.warpaffine import arcface_template, estimate_similarity, warp_affine  # noqa: E402

MEAN, STD = [127.5] * 3, [127.5] * 3


class Faces(torch.utils.data.Dataset):
    """Photographs 250 x 250 with the ArcFace landmarks placed by a random similarity transform."""

    def __init__(self, n: int):
        self.images = photos_bgr(n, (250, 250))
        rng = np.random.default_rng(0)
        template = arcface_template(112).numpy()
        self.landmarks = []
        for _ in range(n):
            a, s = rng.uniform(-0.4, 0.4), rng.uniform(1.4, 2.0)
            R = s * np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
            self.landmarks.append(((template - 56) @ R.T + rng.uniform(100, 150, 2)).astype(np.float32))
        self.labels = rng.integers(0, 10, n)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        # uint8 HWC stays uint8 on the host: copying uint8 and converting on the GPU costs far less
        # than converting on the host and copying floats
        return torch.from_numpy(self.images[i]), torch.from_numpy(self.landmarks[i]), int(self.labels[i])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = torch.utils.data.DataLoader(Faces(args.batch * 2), batch_size=args.batch, shuffle=True,
                                         pin_memory=device.type == "cuda", drop_last=True)
    backbone = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).to(device)
    optimiser = torch.optim.SGD(backbone.parameters(), lr=0.05)
    template = arcface_template(112, device=device)
    step, t0 = 0, time.perf_counter()
    while step < args.steps:
        for images, landmarks, labels in loader:
            images = images.to(device, non_blocking=True)        # [B, H, W, 3] uint8
            landmarks = landmarks.to(device, non_blocking=True)  # [B, 5, 2]
            nhwc = images.permute(0, 3, 1, 2)                    # [B, 3, H, W] view, channels_last memory
            M = estimate_similarity(landmarks, template.expand(len(landmarks), 5, 2))
            # align + uint8 -> float + (x - mean) / std + BGR -> RGB, one pass
            crops = warp_affine(nhwc, M, (112, 112), out_dtype=torch.float32, mean=MEAN, std=STD,
                                reverse_channels=True, out_layout="NCHW")
            loss = nn.functional.cross_entropy(backbone(crops), labels.to(device))
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            step += 1
            print(f"step {step}: loss {loss.item():.4f}")
            if step == args.steps:
                break
    seconds = time.perf_counter() - t0
    print(f"{args.steps} steps of {args.batch} aligned faces on {device}: {args.steps * args.batch / seconds:,.0f} images/s")


if __name__ == "__main__":
    main()
