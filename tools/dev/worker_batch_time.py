"""Host time of one loader worker's batch (orbbec.data's prepare: read the items, draw the parameters,
move the targets, collate), per workload of tools/benchmark_pipeline.py, without a GPU.

    python tools/dev/worker_batch_time.py --workload det [--partial-decode] [--pack] [--profile]
    python tools/dev/worker_batch_time.py --workload det --workers 32 --batches 800

--pack: also what a worker does after prepare on the GPU path: the bytes packed into a reusable
shared-memory slot (HostBatch.pack) and the batch pickled for the trip to the main process (and
unpickled there, timed apart).
--workers N: the GPU loader's workers' own loop instead (orbbec.data's _Batches in a DataLoader of N
workers, slots released as soon as each batch arrives, no decoding): the workers' CPU time per batch
from /proc, after each worker's prefetched batches, to set beside the single-process figures above.
--rate R (with --workers): take R batches a second, about the loader's pace, instead of as fast as the
workers go: the workers' load as the loader puts it on the host, to run beside decoding alone. It
prints "started" once at that pace, and its figure when it ends or is sent SIGTERM."""
import argparse
import cProfile
import os
import pickle
import pstats
import signal
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmark_pipeline import build_data, orbbec_transform  # noqa: E402
from loader_records import proc_cpu_seconds  # noqa: E402

from orbbec.data._keys import _with_generation  # noqa: E402
from orbbec.data._loader import _Batches, _Config, _identity  # noqa: E402
from orbbec.data._samples import prepare  # noqa: E402
from orbbec.data._shared import SlotTable  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workload", default="det")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-sort", default="cumulative", help="--profile: pstats' order (tottime: own time)")
    ap.add_argument("--profile-rows", type=int, default=15, help="--profile: functions listed")
    ap.add_argument("--partial-decode", action="store_true", help="cut each JPEG's rows as the GPU loader does")
    ap.add_argument("--pack", action="store_true", help="pack into a slot and pickle, as a GPU loader's worker does")
    ap.add_argument("--workers", type=int, default=0, help="time N DataLoader workers' loop instead (see above)")
    ap.add_argument("--rate", type=float, default=0.0, help="--workers: batches taken a second (0: all they make)")
    a = ap.parse_args()
    if a.workers:
        return worker_loop(a.workload, a.workers, a.batches, a.rate)
    # One thread, as in a DataLoader worker (torch sets it there): with a pool, det's box ops waited
    # for the pool's threads and the batch measured 10.6 ms against 3.3.
    torch.set_num_threads(1)
    items, batch = build_data(a.workload)
    tf = orbbec_transform(a.workload)
    slots = SlotTable(1, 2)
    unpickle_s = [0.0]

    def one(k):
        b = prepare(items, batch_indices(k, batch, len(items)), transform=tf, seed=0, epoch=1,
                    box_min_visible=0.0, flip_pairs=None, ragged="padded", partial_decode=a.partial_decode)
        if a.pack:
            b.pack(slots, 0, 1)
            data = pickle.dumps(b, protocol=pickle.HIGHEST_PROTOCOL)
            t0 = time.perf_counter()
            pickle.loads(data)
            unpickle_s[0] += time.perf_counter() - t0
            slots.flags.numpy()[:] = 0  # the main process's release, at once

    for k in range(3):
        one(k)
    unpickle_s[0] = 0.0
    t = time.perf_counter()
    for k in range(a.batches):
        one(k)
    worker = (time.perf_counter() - t - unpickle_s[0]) / a.batches
    print(f"{a.workload}: {worker * 1e3:.1f} ms per batch of {batch}"
          + (f" (unpickling in the main process {unpickle_s[0] / a.batches * 1e3:.2f} ms)" if a.pack else ""))
    if a.profile:
        prof = cProfile.Profile()
        prof.runcall(lambda: [one(k) for k in range(a.batches)])
        pstats.Stats(prof).sort_stats(a.profile_sort).print_stats(a.profile_rows)


def worker_loop(workload: str, workers: int, batches: int, rate: float) -> None:
    """The workers' CPU per batch in a DataLoader of `workers` as the GPU loader runs them (partial
    decoding on, bytes packed into slots), timed after the batches they prefetch at the start."""
    items, batch = build_data(workload)
    prefetch = 4
    slots = SlotTable(workers, prefetch + 2)
    # A CUDA device only by name: the workers take the GPU path's branches, and nothing here starts CUDA.
    cfg = _Config(items, orbbec_transform(workload), torch.device("cuda"), "RGB", "raise", "padded", 0.0, None, 0,
                  slots, True)
    skip = prefetch * workers + 20
    # (made as they are taken: a run of millions at a pace, stopped by SIGTERM, fits in memory)
    keys = _with_generation(((1, 0, batch_indices(k, batch, len(items))) for k in range(skip + batches)), 1)
    reader = torch.utils.data.DataLoader(_Batches(cfg), batch_size=None, sampler=keys, num_workers=workers,
                                         collate_fn=_identity, prefetch_factor=prefetch, persistent_workers=True)
    signal.signal(signal.SIGTERM, _stop)
    n = 0
    try:
        for k, b in enumerate(iter(reader)):
            if k == skip:
                pids = [w.pid for w in reader._iterator._workers]
                c0, m0, w0 = sum(map(proc_cpu_seconds, pids)), time.process_time(), time.perf_counter()
                if rate:
                    print("started", flush=True)
            elif k > skip:
                n = k - skip
                ahead = w0 + n / rate - time.perf_counter() if rate else 0.0
                if ahead > 0:
                    time.sleep(ahead)
            b.unpack(slots)
            if b.slot is not None:
                slots.flags.numpy()[b.slot] = 0  # released at once: no GPU work reads it
    except _Stopped:
        pass
    c1, m1, w1 = sum(map(proc_cpu_seconds, pids)), time.process_time(), time.perf_counter()
    n = max(n, 1)
    print(f"{workload}, {workers} workers: their CPU {(c1 - c0) / n * 1e3:.2f} ms per batch of {batch} "
          f"(the main process {(m1 - m0) / n * 1e3:.2f} ms; {n / (w1 - w0):.0f} batches/s)", flush=True)
    os._exit(0)  # persistent workers need not be joined


def batch_indices(k: int, batch: int, n_items: int) -> list:
    """Batch k's dataset indices: the items in turn, round and round."""
    return [(i + batch * k) % n_items for i in range(batch)]


class _Stopped(Exception):
    pass


def _stop(signum, frame):
    raise _Stopped


if __name__ == "__main__":
    main()
