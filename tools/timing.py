"""Helpers shared by the benchmarks in tools/: medians (device work timed with CUDA events), and
printing a result table and writing it to a file."""
from __future__ import annotations

import statistics
import time

import torch


def cuda_time_ms(fn, reps: int, warmup: int = 5, per_group: int = 10) -> float:
    """Median milliseconds per call of fn() on the current stream, from CUDA events around groups of
    per_group back-to-back calls. With the stream kept busy, the host's work to issue a call (Python,
    argument checks, the launch) overlaps the device work queued before it, so an op whose device
    work outlasts its issue is timed by its device work. One call between two events on an idle
    stream counted the issue time as well (the start event fires at once, then the device waits for
    the launch), which made runs on a busy host look slower."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(max(3, reps // per_group)):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn()  # queued ahead of the start event, so that the device is busy when the group begins
        start.record()
        for _ in range(per_group):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / per_group)
    return statistics.median(times)


def host_time_ms(fn, reps: int) -> float:
    """Median wall-clock milliseconds of fn() after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def emit_table(text: str, path=None) -> None:
    """Print the result table and, given a path, write it there (for docs/)."""
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text.rstrip("\n") + "\n")
