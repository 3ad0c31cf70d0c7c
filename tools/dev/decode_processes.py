"""Is the JPEG engine's host-side limit per process? N processes decode the same workload's JPEGs
(decoding alone, driven as the loader drives it) over one shared window of wall-clock time; prints
each process's images/s and their sum. A sum well above one process's rate means the limit is
per process (nvJPEG's or the CUDA context's), not the engine's or the driver's.

    python tools/dev/decode_processes.py --workload cls-500x375 --processes 1,2,3"""
import argparse
import multiprocessing as mp
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def one(workload, start_at, seconds, out):
    sys.path.insert(0, os.path.join(HERE, ".."))
    import torch
    from benchmark_pipeline import build_data
    from workloads import DecodeAhead, full_batches

    items, batch = build_data(workload)
    batches = full_batches([it["image"] for it in items], batch)
    ahead, i = DecodeAhead(), 0
    while time.time() < start_at:  # warm up until the shared window opens
        ahead(batches[i % len(batches)])
        i += 1
    ahead.drain()
    torch.cuda.synchronize()
    late = time.time() - start_at  # the windows overlap only if every process starts on time
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        n += ahead(batches[i % len(batches)])
        i += 1
    n += ahead.drain()
    torch.cuda.synchronize()
    out.put((n / (time.perf_counter() - t0), late))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workload", default="cls-500x375")
    ap.add_argument("--processes", default="1,2")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=12.0, help="seconds from start to the shared window")
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    for n in [int(x) for x in a.processes.split(",")]:
        out = ctx.Queue()
        start_at = time.time() + a.warmup
        procs = [ctx.Process(target=one, args=(a.workload, start_at, a.seconds, out)) for _ in range(n)]
        for p in procs:
            p.start()
        got = [out.get() for _ in procs]
        rates, late = [r for r, _ in got], max(lt for _, lt in got)
        for p in procs:
            p.join()
        print(f"{a.workload:12s} {n} process(es): {sum(rates):8,.0f} img/s in all "
              f"({', '.join(f'{r:,.0f}' for r in rates)}); the last started {late:.2f} s late", flush=True)


if __name__ == "__main__":
    main()
