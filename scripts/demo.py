#!/usr/bin/env python
"""orbbec demo: random-affine augmentation of a batch of sample photographs on the GPU (or the CPU
when there is none), a before/after picture, and the throughput.

    python scripts/demo.py [--batch 256] [--out demo_warpaffine.png]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from workloads import forward_matrices, photos_bgr  # noqa: E402

from orbbec.warpaffine import warp_affine  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=112, help="output crop size")
    parser.add_argument("--out", default="demo_warpaffine.png")
    args = parser.parse_args()
    import cv2

    device = "cuda" if torch.cuda.is_available() else "cpu"
    imgs = photos_bgr(args.batch, (250, 250))
    mats = forward_matrices(args.batch, (250, 250), (args.size, args.size))
    batch = torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).contiguous().to(device)
    M = torch.from_numpy(mats).to(device)

    def run():
        return warp_affine(batch, M, (args.size, args.size), border_mode="reflect101")

    out = run()  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
    reps = 20 if device == "cuda" else 3
    t0 = time.perf_counter()
    for _ in range(reps):
        out = run()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / reps

    # before (top, resized to the crop size for the picture) / after (bottom), first 8 images
    before = [cv2.resize(im, (args.size, args.size)) for im in imgs[:8]]
    after = list(out[:8].permute(0, 2, 3, 1).cpu().numpy())
    picture = np.vstack([np.hstack(before), np.hstack(after)])
    cv2.imwrite(args.out, picture)
    print(f"device: {torch.cuda.get_device_name() if device == 'cuda' else 'CPU'} ({device})")
    print(f"warped {args.batch} images 250x250 -> {args.size}x{args.size} (uint8, bilinear, reflect101) "
          f"in {seconds * 1e3:.3f} ms per batch: {args.batch / seconds:,.0f} images/s")
    print(f"before/after picture: {os.path.abspath(args.out)}")


if __name__ == "__main__":
    main()
