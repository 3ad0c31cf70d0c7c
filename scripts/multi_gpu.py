#!/usr/bin/env python
"""orbbec on several GPUs: each op runs on the device of its inputs and on that device's current
stream, so a batch split across GPUs (as DistributedDataParallel ranks or a manual split hold it)
is warped where it lies, with no copies between devices.

    python scripts/multi_gpu.py [--batch 512]

With one GPU, or none, the same code runs on what there is.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from workloads import forward_matrices, photos_bgr  # noqa: E402

from orbbec.warpaffine import warp_affine  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=512)
    args = parser.parse_args()
    devices = [torch.device(f"cuda:{i}") for i in range(torch.cuda.device_count())] or [torch.device("cpu")]
    images = torch.from_numpy(np.stack(photos_bgr(args.batch, (250, 250)))).permute(0, 3, 1, 2).contiguous()
    M = torch.from_numpy(forward_matrices(args.batch, (250, 250), (112, 112)))
    shards = []
    for dev, idx in zip(devices, torch.arange(args.batch).chunk(len(devices))):
        # each shard is warped on its own device, on that device's current stream
        shards.append(warp_affine(images[idx].to(dev, non_blocking=True), M[idx].to(dev), (112, 112)))
    for dev, shard in zip(devices, shards):
        print(f"{dev}: {tuple(shard.shape)} on {shard.device}")
    whole = warp_affine(images, M, (112, 112))
    assert torch.equal(torch.cat([s.cpu() for s in shards]), whole), "shards differ from the whole-batch warp"
    print(f"{len(devices)} device(s): sharded result equals the whole-batch warp")


if __name__ == "__main__":
    main()
