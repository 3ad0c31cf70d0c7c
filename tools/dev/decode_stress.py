"""Does GPU decoding ever stop? Several processes decode back to back, each beside a thread that keeps
the GPU busy with matmuls, for a fixed time; the parent watches their progress and, when one makes
none for --stall seconds, saves every thread's native and Python stack (gdb, then faulthandler) and
stops it. Prints one line per process: batches, images/s, and whether it stalled.

    python tools/dev/decode_stress.py --procs 4 --seconds 60 --out /tmp/stress
Variants go through the decoder's environment variables (ORBBEC_NVJPEG_LANES, ...)."""
import argparse
import faulthandler
import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from stacks import save_stacks  # noqa: E402


def child(a):
    import torch
    from workloads import JPEG_SETS, full_batches, jpeg_set


    from orbbec.io import decode_jpeg
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if a.set == "mixed":  # 1-32 images of 24 random sizes per batch, as the decoder's memory test
        import cv2
        import numpy as np
        from workloads import photo_crops_bgr
        rng = np.random.default_rng(3 + a.child)
        files = [cv2.imencode(".jpg", photo_crops_bgr(1, (int(h), int(w)))[0])[1].tobytes()
                 for h, w in zip(rng.integers(16, 900, 24), rng.integers(16, 1300, 24))]
        groups = [[files[k] for k in rng.integers(0, 24, int(rng.integers(1, 33)))] for _ in range(200)]
    else:
        files = jpeg_set(a.set)
        batch = JPEG_SETS[a.set][2]
        groups = full_batches(files, batch)
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    stop = threading.Event()
    default = a.child % 2 == 0  # half the processes load the legacy default stream, half their own

    def busy():
        own = torch.cuda.Stream()
        with torch.cuda.stream(torch.cuda.default_stream() if default else own):
            while not stop.is_set():
                for _ in range(10):
                    x @ x
                torch.cuda.current_stream().synchronize()

    if a.load:
        threading.Thread(target=busy, daemon=True).start()
    side = torch.cuda.Stream()
    progress = open(a.progress, "w")
    n, t0 = 0, time.perf_counter()
    with torch.cuda.stream(side):
        while time.perf_counter() - t0 < a.seconds:
            out = decode_jpeg(groups[n % len(groups)], device="cuda")
            if n % 8 == 0:  # results are used on the stream they were returned on
                torch.stack([o[:1, :1].sum() for o in out]).cpu()
            n += 1
            progress.seek(0)
            progress.write(f"{n} {time.perf_counter() - t0:.3f}\n")
            progress.flush()
    stop.set()
    torch.cuda.synchronize()
    progress.seek(0)
    progress.write(f"{n} {time.perf_counter() - t0:.3f} done\n")
    progress.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--stall", type=float, default=20)
    ap.add_argument("--set", default="jpeg-500x375")
    ap.add_argument("--out", default="/tmp/decode_stress")
    ap.add_argument("--no-load", dest="load", action="store_false", help="no matmul thread beside the decoder")
    ap.add_argument("--no-dump", dest="dump", action="store_false", help="do not attach a debugger to a stalled one")
    ap.add_argument("--child", type=int, default=-1)
    ap.add_argument("--progress", default="")
    a = ap.parse_args()
    if a.child >= 0:
        return child(a)
    os.makedirs(a.out, exist_ok=True)
    procs = []
    for k in range(a.procs):
        prog = os.path.join(a.out, f"progress{k}")
        open(prog, "w").close()
        err = open(os.path.join(a.out, f"stderr{k}"), "w")
        p = subprocess.Popen([sys.executable, __file__, "--child", str(k), "--progress", prog, "--set", a.set,
                              "--seconds", str(a.seconds)] + ([] if a.load else ["--no-load"]), stderr=err)
        procs.append((p, prog, [0, time.time()]))
    stalled = set()
    while any(p.poll() is None for p, _, _ in procs):
        time.sleep(1)
        for k, (p, prog, last) in enumerate(procs):
            if p.poll() is not None or k in stalled:
                continue
            text = open(prog).read().split()
            n = int(text[0]) if text else 0
            if n != last[0]:
                last[0], last[1] = n, time.time()
            elif time.time() - last[1] > a.stall + (60 if n == 0 else 0):
                stalled.add(k)
                if len(stalled) == 1 and a.dump:  # the first one's stacks (attaching a debugger takes a while)
                    with open(os.path.join(a.out, f"stacks{k}.txt"), "w") as f:
                        save_stacks(p.pid, f)
                    time.sleep(2)
                p.kill()
    for k, (p, prog, _) in enumerate(procs):
        text = open(prog).read().split()
        n, s = (int(text[0]), float(text[1])) if len(text) >= 2 else (0, 0.0)
        state = "STALLED" if k in stalled else ("ok" if "done" in text else f"exit {p.returncode}")
        print(f"process {k}: {n} batches in {s:.1f} s ({state})", flush=True)
    print(f"{len(stalled)} of {a.procs} stalled", flush=True)


if __name__ == "__main__":
    main()
