"""The memory traffic of the loader's workers without their Python: processes that copy a batch's
JPEG bytes into reusable slots at the loader's pace, as HostBatch.pack does, and nothing else
(loader_stage_probe.py hands it the workload's own JPEGs; alone it copies det-sized buffers).

Beside decoding alone (`loader_stage_probe.py --mode decode --copy-load R`), it tells whether the
workers' copies, rather than their CPU time, slow the decoder: the workers' whole load in another
process slowed det's decoding alone by about the loader's gap, and the loader without its transform
(the workers' CPU halved, the copies kept) ran no closer to decoding alone (docs/dev/decode.md).

    python tools/dev/copy_load.py --rate 400 --seconds 5      (alone: what it achieves)
"""
import argparse
import multiprocessing as mp
import time

import numpy as np
import torch

from orbbec._library import _C

# det's batch: 64 JPEGs of 640 x 640 at quality 90, about 64 KB each, from a set of 256 (the
# benchmark's dataset, shared by the forked workers); each worker keeps a few slots of its own.
IMAGE_BYTES = 64_000
BATCH = 64
SOURCES = 256
SLOTS = 4


def sources(count=SOURCES, nbytes=IMAGE_BYTES, seed=0):
    """The buffers every copier reads (made before the fork, so the processes share their pages, as
    the workers share the dataset's bytes)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, nbytes, dtype=np.uint8) for _ in range(count)]


def copy_batch(src, first, slot, batch):
    """Copies sources first, first + 1, ... (round and round) one after another into `slot` with the
    workers' own copy (pack_buffers); returns the bytes copied."""
    return _C.pack_buffers([src[(first + k) % len(src)] for k in range(batch)], torch.from_numpy(slot))[-1]


def copier(src, batch, rate, stop, done, seed, batches=None):
    """One process: a batch of `batch` sources every 1 / rate seconds into its slots in turn (a
    random phase), until `stop` is set or `batches` are done; counts its batches in `done`."""
    slots = [np.empty(batch * max(b.size for b in src), np.uint8) for _ in range(SLOTS)]
    period = 1.0 / rate
    t = time.perf_counter() + np.random.default_rng(seed).random() * period
    n = 0
    while not stop.is_set() and (batches is None or n < batches):
        wait = t - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        copy_batch(src, (seed * 7 + n) * batch, slots[n % SLOTS], batch)
        n += 1
        with done.get_lock():
            done.value += 1
        t += period
    return slots


def start(rate, processes=32, src=None, batch=BATCH):
    """`processes` copiers making `rate` batches of `batch` buffers of `src` (uint8 arrays; default
    det-sized random ones) a second in all, forked (before CUDA starts in the caller); returns (stop
    event, shared batch count)."""
    ctx = mp.get_context("fork")
    src = sources() if src is None else src
    stop, done = ctx.Event(), ctx.Value("q", 0)
    for k in range(processes):
        ctx.Process(target=copier, args=(src, batch, rate / processes, stop, done, k), daemon=True).start()
    return stop, done


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=400.0, help="batches a second, all processes together")
    ap.add_argument("--processes", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args()
    stop, done = start(a.rate, a.processes)
    time.sleep(a.seconds)
    stop.set()
    mb = BATCH * IMAGE_BYTES / 1e6
    rate = done.value / a.seconds
    print(f"{rate:.0f} batches/s of {mb:.1f} MB ({rate * mb / 1e3:.2f} GB/s copied)")


if __name__ == "__main__":
    main()
