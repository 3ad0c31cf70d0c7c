"""Where the loader loses against decoding alone: GPULoader with the workload's transform, the same
loader with no transform (decoded images handed out as they are), and the decoder alone driven as the
loader drives it; images/s and loader.timing() (ms per batch). One measurement per process (a loader's
workers outlive it for a while), so alternate from the shell:

    for r in 1 2; do for m in transform none decode; do
      python tools/dev/loader_stage_probe.py --workload cls-500x375 --mode $m; done; done

--profile: cProfile of the augmenting thread's work (augment_batch and the targets' move), top lines."""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmark_pipeline import build_data, forever, measure, orbbec_transform, run_decode_only  # noqa: E402


def run_loader(items, batch, seconds, workers, transform):
    from orbbec.data import GPULoader

    loader = GPULoader(items, batch, transform=transform, shuffle=True, num_workers=workers, prefetch=4,
                       drop_last=True, seed=0)
    it = forever(lambda: iter(loader))

    def step():
        images = next(it)["image"]
        return len(images)
    rate, _ = measure(step, seconds, on_start=lambda: loader.timing(reset=True))
    t = loader.timing()
    return rate, {k: round(v * 1e3, 2) for k, v in t.items() if k != "batches"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="cls-500x375")
    ap.add_argument("--mode", choices=("transform", "none", "decode"), default="transform")
    ap.add_argument("--seconds", type=float, default=2.5)
    ap.add_argument("--workers", type=int, default=9)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    prof = None
    if a.profile:
        import cProfile

        import orbbec.data._loader as L

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
        r, t = run_loader(items, batch, a.seconds, a.workers, tf)
    print(f"{a.workload:12s} {a.mode:9s} {r:8,.0f} img/s  {t}", flush=True)
    if prof is not None:
        import pstats

        pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
