"""Why decoding slows down beside a training step: decode_jpeg back to back in a background thread
while the main thread keeps the GPU busy with large matmuls, (a) on the legacy default stream, (b)
on a non-blocking stream of its own, (c) not at all. If (a) is slow and (b) is not, something in the
decoder orders itself after the legacy default stream (synchronous copies, cudaFree); if both are
slow, it waits for the GPU's SMs or synchronises its own work."""
import argparse
import os
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from workloads import JPEG_SETS, full_batches, jpeg_set  # noqa: E402

from orbbec.io import decode_jpeg  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--set", default="jpeg-500x375")
    ap.add_argument("--seconds", type=float, default=2.0)
    a = ap.parse_args()
    files = jpeg_set(a.set)
    batch = JPEG_SETS[a.set][2]
    groups = full_batches(files, batch)
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    for g in groups[:3]:
        decode_jpeg(g, device="cuda")
    torch.cuda.synchronize()
    for load in ("none", "default stream", "own stream"):
        stop = threading.Event()
        own = torch.cuda.Stream()

        def busy():
            with torch.cuda.stream(own if load == "own stream" else torch.cuda.default_stream()):
                while not stop.is_set():
                    for _ in range(20):
                        x @ x
                    torch.cuda.current_stream().synchronize()

        t = threading.Thread(target=busy, daemon=True) if load != "none" else None
        if t:
            t.start()
            time.sleep(0.2)
        side = torch.cuda.Stream()
        n, i, per = 0, 0, []
        t0 = time.perf_counter()
        with torch.cuda.stream(side):
            while time.perf_counter() - t0 < a.seconds:
                s = time.perf_counter()
                decode_jpeg(groups[i % len(groups)], device="cuda")
                per.append(time.perf_counter() - s)
                n, i = n + batch, i + 1
            side.synchronize()
        rate = n / (time.perf_counter() - t0)
        stop.set()
        if t:
            t.join()
        per.sort()
        print(f"{a.set}  GPU load: {load:15s} {rate:8.0f} img/s  host ms per batch median {per[len(per) // 2] * 1e3:6.2f}",
              flush=True)


if __name__ == "__main__":
    main()
