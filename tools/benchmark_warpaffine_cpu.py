#!/usr/bin/env python
"""CPU benchmark: orbbec's CPU warp_affine against cv2.warpAffine with the same number of threads,
on the face workload of docs/workloads.md (512 images 250x250 -> 112x112, uint8 bilinear).
cv2 runs one image per call in a pool of N threads (cv2.setNumThreads(1)), orbbec one batch call
with torch.set_num_threads(N). Prints a markdown table and writes it to --out.

    python tools/benchmark_warpaffine_cpu.py --threads 1,2 --out docs/benchmark_warpaffine_cpu.md
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import emit_table, host_time_ms  # noqa: E402
from workloads import WARP_WORKLOADS, forward_matrices, photos_bgr  # noqa: E402



def median_seconds(fn, reps):
    return host_time_ms(fn, reps) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default=f"1,{os.cpu_count()}", help="comma-separated thread counts")
    parser.add_argument("--workload", default="face", choices=sorted(WARP_WORKLOADS))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    # orbbec after the arguments: --help works where orbbec is not built
    global warp_affine
    from orbbec.warpaffine import warp_affine
    import cv2

    B, (H, W), (OH, OW) = WARP_WORKLOADS[args.workload]
    imgs = photos_bgr(B, (H, W))
    mats = forward_matrices(B, (H, W), (OH, OW))
    nchw = torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).contiguous()
    nhwc = nchw.contiguous(memory_format=torch.channels_last)
    M = torch.from_numpy(mats)
    cv2.setNumThreads(1)
    lines = [f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; torch {torch.__version__}, "
             f"cv2 {cv2.__version__}; workload {args.workload} ({B} images {H}x{W} -> {OH}x{OW}, uint8 bilinear)", "",
             "| threads | orbbec NCHW images/s | orbbec NHWC images/s | cv2.warpAffine images/s | orbbec NCHW / cv2 | orbbec NHWC / cv2 |",
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(n)
        t_nchw = median_seconds(lambda: warp_affine(nchw, M, (OW, OH)), args.reps)
        t_nhwc = median_seconds(lambda: warp_affine(nhwc, M, (OW, OH)), args.reps)
        with ThreadPoolExecutor(n) as pool:
            t_cv2 = median_seconds(lambda: list(pool.map(
                lambda i: cv2.warpAffine(imgs[i], mats[i], (OW, OH), flags=cv2.INTER_LINEAR), range(B))), args.reps)
        lines.append(f"| {n} | {B / t_nchw:,.0f} | {B / t_nhwc:,.0f} | {B / t_cv2:,.0f} | {t_cv2 / t_nchw:.2f}x | {t_cv2 / t_nhwc:.2f}x |")
    lines.append("")
    lines.append(f"Measured with `python tools/benchmark_warpaffine_cpu.py --threads {args.threads} --reps {args.reps}`; "
                 "medians of wall-clock times, cv2 and orbbec alternating in one process.")
    emit_table("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
