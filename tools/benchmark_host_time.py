#!/usr/bin/env python
"""Host time of one synchronous call: orbbec's warp_affine, nms and roi_align beside torchvision.ops
(nms, roi_align) and F.affine_grid + grid_sample, on small inputs where the host's work (Python
argument checks, dispatch, the launch) and not the kernel decides the latency.

Each row is the median wall-clock time of `op(); torch.cuda.current_stream().synchronize()` (no
other work queued): the call and the wait for its work on the stream it ran on, what a training loop
waits for one call (the table also states what a synchronisation alone costs). nms and batched_nms
(orbbec's and torchvision's) are synchronous by themselves: the size of their result is read back
from the GPU before they return, so their rows time the call alone. CUDA by default; --device cpu runs the CPU kernels.

    python tools/benchmark_host_time.py [--device cuda] [--reps 300] [--out host_time.md]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import emit_table, host_time_ms  # noqa: E402


def _cases(device):
    """(name, orbbec call, peer name, peer call or None, whether the calls return only when done)."""
    import torch.nn.functional as F

    from orbbec.nms import batched_nms, nms
    from orbbec.roi_align import roi_align
    from orbbec.warpaffine import warp_affine

    try:
        import torchvision.ops as tv
    except Exception:  # noqa: BLE001  (missing, or not loadable with this torch): orbbec columns only
        tv = None
    g = torch.Generator().manual_seed(0)
    img = torch.randint(0, 256, (8, 3, 112, 112), generator=g, dtype=torch.uint8).to(device)
    M = torch.tensor([[0.9, -0.1, 4.0], [0.1, 0.9, -3.0]], dtype=torch.float64, device=device).expand(8, 2, 3)
    theta = M.float()  # not the same mapping: only the cost of the grid_sample path is compared
    xy = torch.rand(100, 2, generator=g) * 200
    boxes = torch.cat([xy, xy + torch.rand(100, 2, generator=g) * 50 + 1], 1).to(device)
    scores = torch.rand(100, generator=g).to(device)
    classes = torch.randint(0, 5, (100,), generator=g).to(device)
    feats = torch.randn(2, 64, 32, 32, generator=g).to(device)
    rois = torch.cat([torch.zeros(64, 1), torch.rand(64, 2, generator=g) * 64,
                      torch.rand(64, 2, generator=g) * 64 + 64], 1).to(device)

    def grid_sample():
        grid = F.affine_grid(theta, (8, 3, 112, 112), align_corners=False)
        return F.grid_sample(img.float(), grid, align_corners=False)

    return [
        ("warp_affine uint8 8x3x112x112", lambda: warp_affine(img, M, (112, 112)), "affine_grid + grid_sample", grid_sample,
         False),
        ("nms 100 boxes", lambda: nms(boxes, scores, 0.5), "torchvision.ops.nms",
         (lambda: tv.nms(boxes, scores, 0.5)) if tv else None, True),
        ("batched_nms 100 boxes 5 classes", lambda: batched_nms(boxes, scores, classes, 0.5),
         "torchvision.ops.batched_nms", (lambda: tv.batched_nms(boxes, scores, classes, 0.5)) if tv else None, True),
        ("roi_align 64 rois 2x64x32x32", lambda: roi_align(feats, rois, 7, 0.25, 2, True), "torchvision.ops.roi_align",
         (lambda: tv.roi_align(feats, rois, 7, 0.25, 2, True)) if tv else None, False),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--out", help="also write the table to this markdown file")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("benchmark_host_time: no CUDA device here (use --device cpu for the CPU kernels)")
    import orbbec

    sync = (lambda: torch.cuda.current_stream().synchronize()) if args.device == "cuda" else (lambda: None)

    def timed(fn, synchronous):
        return host_time_ms(fn if synchronous else (lambda: (fn(), sync())), args.reps)

    dev_name = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "CPU"
    lines = ["## Host time of one synchronous call (median ms)", "",
             f"- {dev_name}, torch {torch.__version__}, orbbec {orbbec.__version__}, Python {platform.python_version()}",
             f"- median of {args.reps} calls, each followed by a synchronisation of the current stream (nms rows: "
             "the call alone, which returns only after reading its result's size back)", "",
             "| op | orbbec ms | peer | peer ms |", "| --- | --- | --- | --- |"]
    for name, ours, peer_name, peer, synchronous in _cases(args.device):
        peer_ms = f"{timed(peer, synchronous):.3f}" if peer else "n/a (no usable torchvision)"
        lines.append(f"| {name} | {timed(ours, synchronous):.3f} | {peer_name} | {peer_ms} |")
    if args.device == "cuda":
        lines += ["", f"For scale: torch.cuda.synchronize() alone, nothing queued: "
                      f"{host_time_ms(torch.cuda.synchronize, args.reps):.3f} ms; "
                      f"torch.cuda.current_stream().synchronize() alone: {host_time_ms(sync, args.reps):.3f} ms."]
    emit_table("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
