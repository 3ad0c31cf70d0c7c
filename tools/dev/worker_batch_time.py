"""Host time of one loader worker's batch (orbbec.data's prepare: read the items, draw the parameters,
move the targets, collate), per workload of tools/benchmark_pipeline.py, without a GPU.

    python tools/dev/worker_batch_time.py --workload det [--partial-decode] [--profile]"""
import argparse
import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmark_pipeline import build_data, orbbec_transform  # noqa: E402

from orbbec.data._samples import prepare  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workload", default="det")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--partial-decode", action="store_true", help="cut each JPEG's rows as the GPU loader does")
    a = ap.parse_args()
    # One thread, as in a DataLoader worker (torch sets it there): with a pool, det's box ops waited
    # for the pool's threads and the batch measured 10.6 ms against 3.3.
    torch.set_num_threads(1)
    items, batch = build_data(a.workload)
    tf = orbbec_transform(a.workload)

    def one(k):
        prepare(items, [(i + batch * k) % len(items) for i in range(batch)], transform=tf, seed=0, epoch=1,
                box_min_visible=0.0, flip_pairs=None, ragged="padded", partial_decode=a.partial_decode)

    for k in range(3):
        one(k)
    t = time.perf_counter()
    for k in range(a.batches):
        one(k)
    print(f"{a.workload}: {(time.perf_counter() - t) / a.batches * 1e3:.1f} ms per batch of {batch}")
    if a.profile:
        prof = cProfile.Profile()
        prof.runcall(lambda: [one(k) for k in range(a.batches)])
        pstats.Stats(prof).sort_stats("cumulative").print_stats(15)


if __name__ == "__main__":
    main()
