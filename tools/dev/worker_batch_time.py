"""Host time of one loader worker's batch (orbbec.data's prepare: read the items, draw the parameters,
move the targets, collate), per workload of tools/benchmark_pipeline.py, without a GPU.

    python tools/dev/worker_batch_time.py --workload det [--partial-decode] [--pack] [--profile]

--pack: also what a worker does after prepare on the GPU path: the bytes packed into a reusable
shared-memory slot (HostBatch.pack) and the batch pickled for the trip to the main process (and
unpickled there, timed apart)."""
import argparse
import cProfile
import os
import pickle
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmark_pipeline import build_data, orbbec_transform  # noqa: E402

from orbbec.data._samples import prepare  # noqa: E402
from orbbec.data._shared import SlotTable  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workload", default="det")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--partial-decode", action="store_true", help="cut each JPEG's rows as the GPU loader does")
    ap.add_argument("--pack", action="store_true", help="pack into a slot and pickle, as a GPU loader's worker does")
    a = ap.parse_args()
    # One thread, as in a DataLoader worker (torch sets it there): with a pool, det's box ops waited
    # for the pool's threads and the batch measured 10.6 ms against 3.3.
    torch.set_num_threads(1)
    items, batch = build_data(a.workload)
    tf = orbbec_transform(a.workload)
    slots = SlotTable(1, 2)
    unpickle_s = [0.0]

    def one(k):
        b = prepare(items, [(i + batch * k) % len(items) for i in range(batch)], transform=tf, seed=0, epoch=1,
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
        pstats.Stats(prof).sort_stats("cumulative").print_stats(15)


if __name__ == "__main__":
    main()
