"""Why decoding inside GPULoader's thread is slower than decode_jpeg back to back: the same batches
decoded from bytes / from slices of one shared-memory tensor, on the current / a side stream, in the
main / a background thread. Prints images/s for each."""
import os
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from workloads import jpeg_set, pack_jpegs  # noqa: E402

from orbbec.io import decode_jpeg  # noqa: E402


def rate(batches, stream=None, seconds=2.0):
    out = {}

    def body():
        ctx = torch.cuda.stream(stream) if stream is not None else torch.cuda.stream(torch.cuda.current_stream())
        with ctx:
            for b in batches[:2]:
                decode_jpeg(b(), device="cuda")
            torch.cuda.synchronize()
            n, t0, i = 0, time.perf_counter(), 0
            while time.perf_counter() - t0 < seconds:
                b = batches[i % len(batches)]()
                decode_jpeg(b, device="cuda")
                n += len(b)
                i += 1
            torch.cuda.synchronize()
            out["rate"] = n / (time.perf_counter() - t0)
    return body, out


def main():
    files = jpeg_set("jpeg-500x375")
    B = 128
    groups = [files[k:k + B] for k in range(0, len(files), B)]
    as_bytes = [lambda g=g: g for g in groups]

    def shm(g):
        def make():
            flat, off = pack_jpegs(g)
            arr = torch.from_numpy(flat).share_memory_().numpy()
            return [arr[off[i]:off[i + 1]] for i in range(len(g))]
        return make
    premade = [shm(groups[k % len(groups)])() for k in range(300)]  # fresh pages, as each worker batch is
    as_shm = [lambda p=p: p for p in premade]
    side = torch.cuda.Stream()
    for name, batches, stream, thread in [("bytes, current stream, main thread", as_bytes, None, False),
                                          ("shm slices, current stream, main thread", as_shm, None, False),
                                          ("bytes, side stream, main thread", as_bytes, side, False),
                                          ("bytes, side stream, thread", as_bytes, side, True),
                                          ("shm slices, side stream, thread", as_shm, side, True)]:
        body, out = rate(batches, stream, seconds=1.0)
        if thread:
            t = threading.Thread(target=body)
            t.start()
            t.join()
        else:
            body()
        print(f"{name:45s} {out['rate']:9.0f} img/s", flush=True)


if __name__ == "__main__":
    main()
