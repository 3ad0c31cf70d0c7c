#!/usr/bin/env python
"""Benchmark of orbbec.nms beside torchvision.ops in one run, on the NMS workloads of
docs/workloads.md: box centres uniform in [0, 1000)^2, widths and heights uniform in [10, 200),
scores uniform in [0, 1), IoU threshold 0.5, a torch.Generator seeded with N (drawn in that order,
float32, then class ids uniform in [0, classes) for batched_nms).

GPU: nms at N = 1,000 / 10,000 / 50,000 and batched_nms (80 classes) at 10,000 / 50,000, timed
with CUDA events around the whole call (sort, kernels and the host read of the kept count),
median of --reps runs after warm-up. CPU: nms at 10,000, median of --cpu-reps runs.
Every row checks that orbbec and torchvision keep the same set of boxes. Prints a markdown table
last and writes it to --out.

    python tools/benchmark_nms.py --out docs/benchmark_nms.md
"""
from __future__ import annotations

import argparse
import platform
import subprocess
import sys

import os

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import cuda_time_ms, emit_table, host_time_ms  # noqa: E402


try:
    import torchvision
except ImportError:  # the orbbec columns are still measured
    torchvision = None


def workload(n: int, classes: int, device: str):
    g = torch.Generator().manual_seed(n)
    centre = torch.rand(n, 2, generator=g) * 1000
    wh = torch.rand(n, 2, generator=g) * 190 + 10
    boxes = torch.cat([centre - wh / 2, centre + wh / 2], 1)
    scores = torch.rand(n, generator=g)
    idxs = torch.randint(0, classes, (n,), generator=g)
    return boxes.to(device), scores.to(device), idxs.to(device)


def measure(op: str, n: int, classes: int, device: str, reps: int, iou: float) -> dict:
    boxes, scores, idxs = workload(n, classes, device)
    tv = torchvision.ops if torchvision else None
    if op == "nms":
        def ours_fn():
            return nms(boxes, scores, iou)

        def theirs_fn():
            return tv.nms(boxes, scores, iou)
    else:
        def ours_fn():
            return batched_nms(boxes, scores, idxs, iou)

        def theirs_fn():
            return tv.batched_nms(boxes, scores, idxs, iou)
    timer = cuda_time_ms if device == "cuda" else host_time_ms
    ours = ours_fn()
    row = {"op": op, "n": n, "classes": classes if op == "batched_nms" else "", "device": device,
           "kept": len(ours), "ours_ms": timer(ours_fn, reps), "theirs_ms": None, "same": "n/a"}
    if tv is not None:
        theirs = theirs_fn()
        diff = sorted(set(ours.tolist()) ^ set(theirs.tolist()))
        row["same"] = "yes" if not diff else "NO"
        if diff:  # say which boxes, and whether their scores tie with another box (tie-breaking)
            s = scores.cpu()
            ties = [i for i in diff[:20] if int((s == s[i]).sum()) > 1]
            print(f"benchmark_nms: {op} N={n}: {len(diff)} boxes kept by only one side, e.g. {diff[:20]} "
                  f"(scores {s[diff[:20]].tolist()}; with tied scores: {ties})", file=sys.stderr)
        row["theirs_ms"] = timer(theirs_fn, reps)
    return row


def environment() -> list:
    lines = [f"torch {torch.__version__}, torchvision {torchvision.__version__ if torchvision else 'not installed'}, "
             f"orbbec {orbbec.__version__}, Python {platform.python_version()}"]
    if torch.cuda.is_available():
        driver = "unknown"
        try:
            driver = subprocess.check_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                             text=True).splitlines()[0].strip()
        except (OSError, subprocess.CalledProcessError, IndexError):
            pass
        lines.insert(0, f"GPU: {torch.cuda.get_device_name()} (driver {driver}, CUDA {torch.version.cuda})")
    lines.append(f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads")
    return lines


def table(rows: list, env: list, args) -> str:
    out = ["## NMS: orbbec vs torchvision.ops", ""] + [f"- {line}" for line in env]
    out += [f"- IoU threshold {args.iou}; GPU rows: median of {args.reps} runs (CUDA events), "
            f"CPU rows: median of {args.cpu_reps} runs", ""]
    out += ["| op | N | classes | device | kept | orbbec ms | torchvision ms | speed-up | same keep set |",
            "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        theirs = f"{r['theirs_ms']:.3f}" if r["theirs_ms"] is not None else "n/a"
        speed = f"{r['theirs_ms'] / r['ours_ms']:.1f}x" if r["theirs_ms"] is not None else "n/a"
        out.append(f"| {r['op']} | {r['n']:,} | {r['classes']} | {r['device']} | {r['kept']:,} | "
                   f"{r['ours_ms']:.3f} | {theirs} | {speed} | {r['same']} |")
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 50000], help="N for GPU nms")
    p.add_argument("--batched-sizes", type=int, nargs="+", default=[10000, 50000], help="N for GPU batched_nms")
    p.add_argument("--classes", type=int, default=80, help="classes for batched_nms")
    p.add_argument("--cpu-sizes", type=int, nargs="*", default=[10000], help="N for CPU nms (none: skip)")
    p.add_argument("--iou", type=float, default=0.5, help="IoU threshold")
    p.add_argument("--reps", type=int, default=50, help="timed GPU runs (at least 20)")
    p.add_argument("--cpu-reps", type=int, default=5, help="timed CPU runs")
    p.add_argument("--out", help="write the markdown table to this file")
    args = p.parse_args()
    # orbbec after the arguments: --help works where orbbec is not built
    global orbbec, batched_nms, nms
    import orbbec
    from orbbec.nms import batched_nms, nms
    if args.reps < 20:
        p.error("--reps must be at least 20")

    rows = []
    if torch.cuda.is_available():
        for n in args.sizes:
            rows.append(measure("nms", n, args.classes, "cuda", args.reps, args.iou))
            print(rows[-1], flush=True)
        for n in args.batched_sizes:
            rows.append(measure("batched_nms", n, args.classes, "cuda", args.reps, args.iou))
            print(rows[-1], flush=True)
    else:
        print("benchmark_nms: no CUDA device, GPU rows skipped", file=sys.stderr)
    for n in args.cpu_sizes:
        rows.append(measure("nms", n, args.classes, "cpu", args.cpu_reps, args.iou))
        print(rows[-1], flush=True)

    emit_table(table(rows, environment(), args), args.out)
    return 0 if all(r["same"] != "NO" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
