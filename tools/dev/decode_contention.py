"""Why the decoder's own host time per batch is longer inside GPULoader than back to back: decode_jpeg
on one JPEG set with N processes keeping CPU cores busy (as DataLoader workers do) and with the
decoder's thread count set, each in a fresh process. Prints images/s per (busy processes, threads)."""
import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def spin(stop):
    x = 0
    while not stop.is_set():
        for _ in range(10000):
            x += 1


def one(set_name, busy, threads, seconds):
    sys.path.insert(0, os.path.join(HERE, ".."))
    import torch
    from workloads import JPEG_SETS, full_batches, jpeg_set
    from orbbec.io import decode_jpeg, set_decode_threads

    if threads:
        set_decode_threads(threads)
    files = jpeg_set(set_name)
    batch = JPEG_SETS[set_name][2]
    groups = full_batches(files, batch)
    stop = mp.Event()
    procs = [mp.Process(target=spin, args=(stop,), daemon=True) for _ in range(busy)]
    for p in procs:
        p.start()
    for g in groups[:3]:
        decode_jpeg(g, device="cuda")
    torch.cuda.synchronize()
    n, i, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        g = groups[i % len(groups)]
        decode_jpeg(g, device="cuda")
        n, i = n + len(g), i + 1
    torch.cuda.synchronize()
    rate = n / (time.perf_counter() - t0)
    stop.set()
    print(f"{set_name:14s} busy {busy:2d}  threads {threads or 'default':>7}  {rate:9.0f} img/s", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sets", default="jpeg-640,jpeg-250,jpeg-500x375")
    ap.add_argument("--busy", default="0,6,12")
    ap.add_argument("--threads", default="0,4")
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--one", nargs=3)
    a = ap.parse_args()
    if a.one:
        return one(a.one[0], int(a.one[1]), int(a.one[2]), a.seconds)
    for s in a.sets.split(","):
        for t in a.threads.split(","):
            for b in a.busy.split(","):
                subprocess.run([sys.executable, __file__, "--seconds", str(a.seconds), "--one", s, b, t], check=False)


if __name__ == "__main__":
    main()
