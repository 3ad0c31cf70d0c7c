#!/usr/bin/env python
"""orbbec demo: random-affine augmentation of a batch of sample photographs on the GPU (or the CPU
when there is none), a labelled before/after picture, and the throughput.

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
from workloads import forward_matrices, photo_crops_bgr  # noqa: E402

from orbbec.warpaffine import warp_affine  # noqa: E402


def transform_label(m: np.ndarray) -> str:
    """The rotation, scale and shift of a cv2 similarity matrix (src -> dst), for the picture."""
    angle = np.degrees(np.arctan2(m[0, 1], m[0, 0]))
    scale = np.hypot(m[0, 0], m[0, 1])
    return f"rot {angle:+.0f} deg, x{scale:.2f}"


def before_after_picture(before: list, after: np.ndarray, mats: np.ndarray, size: int) -> np.ndarray:
    """Two labelled rows: the input photographs (resized to the crop size for the picture) and their
    warps, each warp captioned with the transform applied to it."""
    import cv2

    font, white = cv2.FONT_HERSHEY_SIMPLEX, (255, 255, 255)
    label_w, caption_h = 70, 18

    def row(tiles, title, captions=None):
        cells = []
        for i, tile in enumerate(tiles):
            cell = np.zeros((size + caption_h, size, 3), np.uint8)
            cell[:size] = tile
            if captions:
                cv2.putText(cell, captions[i], (2, size + 13), font, 0.32, white, 1, cv2.LINE_AA)
            cells.append(np.pad(cell, ((0, 0), (0, 2), (0, 0))))
        strip = np.hstack(cells)
        label = np.zeros((strip.shape[0], label_w, 3), np.uint8)
        cv2.putText(label, title, (6, size // 2 + 5), font, 0.5, white, 1, cv2.LINE_AA)
        return np.hstack([label, strip])

    top = row([cv2.resize(im, (size, size), interpolation=cv2.INTER_AREA) for im in before], "before",
              ["input 250x250"] * len(before))
    bottom = row(list(after), "after", [transform_label(m) for m in mats])
    title = np.zeros((26, top.shape[1], 3), np.uint8)
    cv2.putText(title, f"warp_affine: random rotation, scale and shift -> {size}x{size}, bilinear, reflect101 border",
                (6, 18), font, 0.45, white, 1, cv2.LINE_AA)
    return np.vstack([title, top, bottom])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=112, help="output crop size")
    parser.add_argument("--out", default="demo_warpaffine.png")
    args = parser.parse_args()
    import cv2

    device = "cuda" if torch.cuda.is_available() else "cpu"
    imgs = photo_crops_bgr(args.batch, (250, 250))  # sample photographs, cropped and mirrored
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

    cv2.imwrite(args.out, before_after_picture(imgs[:8], out[:8].permute(0, 2, 3, 1).cpu().numpy(), mats[:8],
                                               args.size))
    print(f"device: {torch.cuda.get_device_name() if device == 'cuda' else 'CPU'} ({device})")
    print(f"warped {args.batch} images 250x250 -> {args.size}x{args.size} (uint8, bilinear, reflect101) "
          f"in {seconds * 1e3:.3f} ms per batch: {args.batch / seconds:,.0f} images/s")
    print(f"before/after picture: {os.path.abspath(args.out)}")


if __name__ == "__main__":
    main()
