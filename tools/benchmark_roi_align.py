#!/usr/bin/env python
"""Times orbbec.roi_align beside torchvision.ops.roi_align on the RoIAlign workloads of docs/workloads.md
(box, fpn, mask), in one run on one GPU, and prints a markdown table (last).

Rois, as docs/workloads.md: batch index uniform in [0, N); x1, y1 uniform in [0, 1100) x [0, 700),
scaled by the map's image size (map size / spatial_scale) over 1216 x 800, the image size of the box
and mask maps (so unscaled there); widths and heights uniform in [16, 316). torch.Generator seed 0.

Per workload: forward float32; forward + backward float32 with a random normal output gradient;
forward float16; forward + backward under torch.use_deterministic_algorithms(True) (orbbec's
deterministic kernel, held against torchvision's default atomic backward; --tv-deterministic also
times torchvision in deterministic mode, where it falls back to a Python implementation).
CUDA events around each call after --warmup calls; the median of --reps calls.

Example: python tools/benchmark_roi_align.py --out docs/roi_align_benchmark.md
"""
from __future__ import annotations

import argparse
import subprocess
import sys

import os

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import cuda_time_ms, emit_table  # noqa: E402

WORKLOADS = {
    # name: (features N, C, H, W), rois, output size, spatial_scale, sampling_ratio, aligned
    "box": ((2, 256, 200, 304), 1024, 7, 0.25, 2, True),
    "fpn": ((8, 256, 168, 256), 4096, 7, 0.25, 0, True),
    "mask": ((2, 256, 200, 304), 512, 14, 0.25, 2, True),
}
REFERENCE_IMAGE_WH = (1216.0, 800.0)


def make_rois(n, map_hw, scale, count, gen):
    img_h, img_w = map_hw[0] / scale, map_hw[1] / scale
    b = torch.randint(0, n, (count,), generator=gen).float()
    x1 = torch.rand(count, generator=gen) * 1100.0 * (img_w / REFERENCE_IMAGE_WH[0])
    y1 = torch.rand(count, generator=gen) * 700.0 * (img_h / REFERENCE_IMAGE_WH[1])
    w = 16.0 + torch.rand(count, generator=gen) * 300.0
    h = 16.0 + torch.rand(count, generator=gen) * 300.0
    return torch.stack([b, x1, y1, x1 + w, y1 + h], 1)


class Deterministic:
    def __init__(self, on):
        self.on = on

    def __enter__(self):
        self.prev = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(self.on)

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.prev)


def forward_backward(fn, x, rois, grad, args):
    def run():
        out = fn(x, rois, *args)
        return torch.autograd.grad(out, x, grad)
    return run


def bench_workload(name, args, tv_roi_align, channels_last):
    from orbbec.roi_align import roi_align

    shape, count, size, scale, sr, aligned = WORKLOADS[name]
    gen = torch.Generator().manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    feats = torch.randn(shape, generator=gen).cuda().contiguous(memory_format=fmt)
    rois = make_rois(shape[0], shape[2:], scale, count, gen).cuda()
    grad = torch.randn((count, shape[1], size, size), generator=gen).cuda()
    call_args = ((size, size), scale, sr, aligned)
    tag = name + (" (channels_last)" if channels_last else "")
    rows = []

    def row(what, ours, theirs, note=""):
        rows.append((tag, what, ours, theirs, note))

    def measure(fn, x, r, g=None, det=False):
        with Deterministic(det):
            if g is None:
                return cuda_time_ms(lambda: fn(x, r, *call_args), args.reps, args.warmup)
            return cuda_time_ms(forward_backward(fn, x, r, g, call_args), args.reps, args.warmup)

    xg = feats.detach().requires_grad_()
    f16, r16 = feats.half(), rois.half()
    diff = ""
    if tv_roi_align is not None:
        with torch.no_grad():
            d = (roi_align(feats, rois, *call_args) - tv_roi_align(feats, rois, *call_args)).abs().max().item()
        diff = f"max abs diff to torchvision {d:.1e}"

    ours_fwd = measure(roi_align, feats, rois)
    tv = (lambda *a, **k: measure(tv_roi_align, *a, **k)) if tv_roi_align is not None else (lambda *a, **k: None)
    row("forward fp32", ours_fwd, tv(feats, rois), diff)
    tv_fb = tv(xg, rois, grad)
    row("forward + backward fp32", measure(roi_align, xg, rois, grad), tv_fb)
    ours_f16 = measure(roi_align, f16, r16)
    row("forward fp16", ours_f16, tv(f16, r16), f"orbbec fp16 / fp32 time {ours_f16 / ours_fwd:.2f}")
    ours_det = measure(roi_align, xg, rois, grad, det=True)
    row("deterministic forward + backward", ours_det, tv_fb, "torchvision: its default (atomic) backward")
    if args.tv_deterministic and tv_roi_align is not None:
        row("deterministic forward + backward", ours_det, tv(xg, rois, grad, det=True),
            "torchvision in deterministic mode")
    return rows


def versions():
    import orbbec

    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.check_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                         text=True).splitlines()[0].strip()
    except (OSError, subprocess.CalledProcessError, IndexError):
        driver = "unknown"
    try:
        import torchvision
        tv = torchvision.__version__
    except ImportError:
        tv = "not installed"
    return (f"GPU: {props.name} ({props.multi_processor_count} SMs), driver {driver}, CUDA {torch.version.cuda}; "
            f"torch {torch.__version__}, torchvision {tv}, orbbec built with CUDA "
            f"{orbbec.get_compiling_cuda_version()}")


def table(rows, header):
    lines = [header, "", "| workload | measurement | orbbec ms | torchvision ms | speed-up | note |",
             "| --- | --- | ---: | ---: | ---: | --- |"]
    for tag, what, ours, theirs, note in rows:
        tv = f"{theirs:.3f}" if theirs is not None else "-"
        ratio = f"{theirs / ours:.2f}x" if theirs is not None else "-"
        lines.append(f"| {tag} | {what} | {ours:.3f} | {tv} | {ratio} | {note} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="box,fpn,mask",
                        help="comma-separated subset of: " + ", ".join(WORKLOADS) + " (default: all)")
    parser.add_argument("--reps", type=int, default=50, help="timed calls per figure, median reported (>= 20)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls before timing")
    parser.add_argument("--channels-last", action="store_true",
                        help="also time channels_last feature maps (both libraries)")
    parser.add_argument("--tv-deterministic", action="store_true",
                        help="also time torchvision under deterministic algorithms (slow Python path)")
    parser.add_argument("--no-torchvision", action="store_true", help="time orbbec alone")
    parser.add_argument("--out", help="also write the markdown table to this file")
    args = parser.parse_args(argv)
    if args.reps < 20:
        parser.error("--reps must be at least 20")
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {list(WORKLOADS)}")
    if not torch.cuda.is_available():
        sys.exit("benchmark_roi_align: needs a CUDA device")

    tv_roi_align = None
    if not args.no_torchvision:
        try:
            from torchvision.ops import roi_align as tv_roi_align
        except ImportError:
            print("benchmark_roi_align: torchvision not importable; timing orbbec alone", file=sys.stderr)

    rows = []
    for name in names:
        for cl in ([False, True] if args.channels_last else [False]):
            rows += bench_workload(name, args, tv_roi_align, cl)
            print(f"done: {name}{' channels_last' if cl else ''}", file=sys.stderr)
    header = (f"RoIAlign, orbbec vs torchvision.ops.roi_align (median of {args.reps} calls, ms; speed-up = "
              f"torchvision / orbbec).\n\n{versions()}")
    emit_table(table(rows, header), args.out)


if __name__ == "__main__":
    main()
