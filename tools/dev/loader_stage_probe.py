"""Where the loader loses against decoding alone: GPULoader with the workload's transform, the same
loader with no transform (decoded images handed out as they are), and the decoder alone driven as the
loader drives it; images/s and loader.timing() (ms per batch). One measurement per process (a loader's
workers outlive it for a while), so alternate from the shell:

    for r in 1 2; do for m in transform none decode; do
      python tools/dev/loader_stage_probe.py --workload cls-500x375 --mode $m; done; done

--profile: cProfile of the augmenting thread's work (augment_batch and the targets' move), top lines.
--cpu: CPU time per batch of each Python thread of the loader's process (a Python thread's CPU time
is about the time it held the GIL: torch's host calls keep it), of the native threads (the decoder's
pool) and of the workers; Python threads summing to about the wall time per batch mean the GIL bounds
the loader."""
import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmark_pipeline import build_data, forever, measure, orbbec_transform, run_decode_only  # noqa: E402


def _proc_cpu(pid, task=None):
    with open(f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuClock:
    """CPU seconds of each Python thread (by name), of the whole process and of the worker processes."""

    def __init__(self, worker_pids=()):
        self.worker_pids = list(worker_pids)

    def read(self):
        out = {"process": time.process_time(), "workers": sum(_proc_cpu(p) for p in self.worker_pids)}
        for t in threading.enumerate():
            try:  # (pthread_getcpuclockid of another thread read nonsense on the GPU machine)
                out["py:" + t.name] = _proc_cpu(os.getpid(), t.native_id)
            except (OSError, TypeError):
                pass
        return out

    @staticmethod
    def per_batch(a, b, batches, wall):
        d = {k: b[k] - a.get(k, 0.0) for k in b}
        py = sum(v for k, v in d.items() if k.startswith("py:"))
        d["native (process less Python threads)"] = d["process"] - py
        d["Python threads together"] = py
        d["wall"] = wall
        return {k: round(v / max(batches, 1) * 1e3, 2) for k, v in d.items()}


def run_loader(items, batch, seconds, workers, transform, cpu=False):
    from orbbec.data import GPULoader

    loader = GPULoader(items, batch, transform=transform, shuffle=True, num_workers=workers, prefetch=4,
                       drop_last=True, seed=0)
    it = forever(lambda: iter(loader))
    marks = {}

    def step():
        images = next(it)["image"]
        marks["n"] = marks.get("n", 0) + 1
        return len(images)

    def start():
        loader.timing(reset=True)
        if cpu:
            pids = [w.pid for w in getattr(loader._reader._iterator, "_workers", [])]
            marks["clock"] = CpuClock(pids)
            marks["a"], marks["t"], marks["n"] = marks["clock"].read(), time.perf_counter(), 0
    rate, _ = measure(step, seconds, on_start=start)
    t = loader.timing()
    out = {k: round(v * 1e3, 2) for k, v in t.items() if k != "batches"}
    if cpu:
        b = marks["clock"].read()
        out["cpu ms/batch"] = CpuClock.per_batch(marks["a"], b, marks["n"], time.perf_counter() - marks["t"])
    return rate, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="cls-500x375")
    ap.add_argument("--mode", choices=("transform", "none", "decode"), default="transform")
    ap.add_argument("--seconds", type=float, default=2.5)
    ap.add_argument("--workers", type=int, default=9)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--cpu", action="store_true")
    a = ap.parse_args()
    prof = None
    if a.profile:
        import cProfile

        import orbbec.data._stream as L

        prof = cProfile.Profile()
        for name in ("augment_batch", "_pin_and_move"):
            def wrapped(*args, _f=getattr(L, name)):
                return prof.runcall(_f, *args)
            setattr(L, name, wrapped)
    items, batch = build_data(a.workload)
    if a.mode == "decode":
        r, t = run_decode_only(a.workload, items, batch, a.seconds, a.workers)[0], ""
    else:
        tf = orbbec_transform(a.workload) if a.mode == "transform" else None
        r, t = run_loader(items, batch, a.seconds, a.workers, tf, cpu=a.cpu)
    print(f"{a.workload:12s} {a.mode:9s} {r:8,.0f} img/s  {t}", flush=True)
    if prof is not None:
        import pstats

        pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
