"""Helpers shared by the benchmarks in tools/: medians (device work timed with CUDA events), and
printing a result table and writing it to a file."""
from __future__ import annotations

import statistics
import time

import torch


def cuda_time_ms(fn, reps: int, warmup: int = 5) -> float:
    """Median milliseconds of fn() on the current stream, timed with CUDA events after warm-up."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
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
