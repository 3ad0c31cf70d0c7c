"""How one core's speed depends on the other cores' load, on the host alone (no GPU).

The decoder's host side slows when the loader's workers keep other cores busy, even cores it does
not run on (docs/dev/decode.md, "Open"). Two guesses: the cores' clock (turbo falls as more cores
are active) or what the cores share (last-level cache, memory bandwidth). This probe separates them:
one process pinned to the first core times a loop that stays in its own core's registers and cache
(a change there is the clock) and a copy of 256 MB into another 256 MB, more than the GPU host's
300 MiB last-level cache (a change there is memory bandwidth), while N processes pinned to other
cores spin, either in a compute loop or copying memory.

    python tools/dev/host_contention.py [--busy 0,4,8,14] [--seconds 1.0]
    python tools/dev/host_contention.py --pairs 0,1 [--seconds 0.5]

--pairs: for each listed core, its compute loop while one other core at a time spins: a core that
slows it far more than the rest shares its physical core (a sibling thread the guest is not told of).

Prints, per load, the compute loop's ns per iteration and the copy's GB/s (best and median of
repeats). Findings on the GPU machine: docs/dev/decode.md, "Open".
"""
import argparse
import multiprocessing as mp
import os
import statistics
import time

import numpy as np

COPY_MB = 256


def _spin(kind, core, stop):
    os.sched_setaffinity(0, {core})
    if kind == "compute":
        x = 0
        while not stop.is_set():
            for i in range(100_000):
                x += i
    else:
        a = np.ones(COPY_MB * 2**20 // 8)
        b = np.empty_like(a)
        while not stop.is_set():
            np.copyto(b, a)


def _compute_ns(n=1_000_000):
    t = time.perf_counter()
    x = 0
    for i in range(n):
        x += i
    return (time.perf_counter() - t) / n * 1e9


def _copy_gbs(a, b):
    t = time.perf_counter()
    np.copyto(b, a)
    return 2 * a.nbytes / (time.perf_counter() - t) / 1e9


def measure(seconds):
    a = np.ones(COPY_MB * 2**20 // 8)
    b = np.empty_like(a)
    np.copyto(b, a)
    compute, copy = [], []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        compute.append(_compute_ns())
        copy.append(_copy_gbs(a, b))
    return compute, copy


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy", default="0,4,8,14", help="numbers of other cores kept busy")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--pairs", default="", help="cores to measure against each other core spinning alone")
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    ctx = mp.get_context("fork")
    if args.pairs:
        for me in [int(v) for v in args.pairs.split(",")]:
            os.sched_setaffinity(0, {me})
            alone = statistics.median(measure(args.seconds)[0])
            row = []
            for k in cores:
                if k == me:
                    continue
                stop = ctx.Event()
                p = ctx.Process(target=_spin, args=("compute", k, stop), daemon=True)
                p.start()
                time.sleep(0.1)
                row.append(f"{k}:{statistics.median(measure(args.seconds)[0]) / alone:.2f}")
                stop.set()
                p.join(5)
            print(f"core {me} alone {alone:.1f} ns/iter; its loop's time with one other core spinning, "
                  f"relative: {' '.join(row)}", flush=True)
        return
    me, others = cores[0], cores[1:]
    os.sched_setaffinity(0, {me})
    print(f"{len(cores)} cores; measuring on core {me}")
    for kind in ("compute", "memory"):
        for n in [int(v) for v in args.busy.split(",")]:
            n = min(n, len(others))
            stop = ctx.Event()
            procs = [ctx.Process(target=_spin, args=(kind, c, stop), daemon=True) for c in others[:n]]
            for p in procs:
                p.start()
            time.sleep(0.3 if n else 0)
            compute, copy = measure(args.seconds)
            stop.set()
            for p in procs:
                p.join(5)
                if p.is_alive():
                    p.kill()
            line = (f"{n:2d} cores busy ({kind:7s}): compute loop {min(compute):.1f} ns/iter best, "
                    f"{statistics.median(compute):.1f} median; copy {max(copy):.1f} GB/s best, "
                    f"{statistics.median(copy):.1f} median")
            print(line, flush=True)


if __name__ == "__main__":
    main()
