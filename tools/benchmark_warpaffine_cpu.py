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
    parser.add_argument("--modes", action="store_true",
                        help="every interpolation x border mode (NHWC against cv2) instead of the layout table")
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
    if args.modes:
        return modes_table(args, cv2, imgs, mats, nhwc, M, B, (H, W), (OH, OW))
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


INTERPS = ("nearest", "bilinear", "bicubic")
BORDERS = ("constant", "replicate", "reflect", "reflect101", "wrap")


def modes_table(args, cv2, imgs, mats, nhwc, M, B, in_hw, out_hw):
    """images/s of orbbec (NHWC batch) and cv2.warpAffine (a thread pool) for every interpolation and
    border mode, at each thread count."""
    (H, W), (OH, OW) = in_hw, out_hw
    cv_interp = {"nearest": cv2.INTER_NEAREST, "bilinear": cv2.INTER_LINEAR, "bicubic": cv2.INTER_CUBIC}
    cv_border = {"constant": cv2.BORDER_CONSTANT, "replicate": cv2.BORDER_REPLICATE, "reflect": cv2.BORDER_REFLECT,
                 "reflect101": cv2.BORDER_REFLECT_101, "wrap": cv2.BORDER_WRAP}
    threads = [int(t) for t in args.threads.split(",")]
    head = "| interpolation | border | " + " | ".join(f"{n} thr: orbbec / cv2 img/s | ratio" for n in threads) + " |"
    lines = [f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; torch {torch.__version__}, "
             f"cv2 {cv2.__version__}; workload {args.workload} ({B} images {H}x{W} -> {OH}x{OW}, uint8, NHWC)", "",
             head, "|---|---|" + "---:|---:|" * len(threads)]
    for interp in INTERPS:
        for border in BORDERS:
            cells = []
            for n in threads:
                torch.set_num_threads(n)
                t_o = median_seconds(lambda: warp_affine(nhwc, M, (OW, OH), interpolation=interp, border_mode=border),
                                     args.reps)
                flags = cv_interp[interp]
                with ThreadPoolExecutor(n) as pool:
                    t_c = median_seconds(lambda: list(pool.map(lambda i: cv2.warpAffine(
                        imgs[i], mats[i], (OW, OH), flags=flags, borderMode=cv_border[border]), range(B))), args.reps)
                cells.append(f"{B / t_o:,.0f} / {B / t_c:,.0f} | {t_c / t_o:.2f}x")
            lines.append(f"| {interp} | {border} | " + " | ".join(cells) + " |")
    lines += ["", f"Measured with `python tools/benchmark_warpaffine_cpu.py --modes --threads {args.threads} "
              f"--reps {args.reps}`; medians of wall-clock times, cv2 and orbbec alternating in one process."]
    emit_table("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
