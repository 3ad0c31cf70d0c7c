"""Batched JPEG decoding, images/s, orbbec.io beside its peers in one run on one GPU.

Sets (tools/workloads.py): jpeg-1080p (batches of 64) and jpeg-500x375 (batches of 128). Every
decoder runs `--seconds` of back-to-back batches after a warm-up; the clock stops after a device
synchronise, so queued GPU work is counted. orbbec decodes on the current stream, the one a training
loop uses. Peers: torchvision.io.decode_jpeg(list, device='cuda'); nvImageCodec (hardware engine
only, and its default backends); DALI's mixed decoder (hw_decoder_load 0.65 and 1.0); cv2.imdecode in
one process per core. Peers that are not installed are listed as such.

Also: pixels against cv2.imdecode per set and chroma sampling, and region-of-interest decoding on
1080p (a RandomResizedCrop-like box per image).

    python tools/benchmark_decode.py [--seconds 3] [--md docs/benchmark_decode.md] [--plot docs/benchmark_decode.png]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _rate(run_batch, batches, seconds, sync, label=""):
    """images/s of run_batch over the batches, cycled for `seconds` after two warm-up rounds."""
    if label:
        print(f"  measuring {label}", flush=True)
    for b in batches[:2] * 2:
        run_batch(b)
    sync()
    n, i, t0 = 0, 0, time.perf_counter()
    while True:
        b = batches[i % len(batches)]
        run_batch(b)
        n += len(b)
        i += 1
        if i % len(batches) == 0 and time.perf_counter() - t0 > seconds:
            break
    sync()
    rate = n / (time.perf_counter() - t0)
    if label:
        print(f"  {label}: {rate:.0f} images/s", flush=True)
    return rate


_FILES = None


def _cv2_init(files):
    global _FILES
    import cv2

    cv2.setNumThreads(1)
    _FILES = files


def _cv2_chunk(idx):
    import cv2

    for i in idx:
        cv2.imdecode(np.frombuffer(_FILES[i], np.uint8), cv2.IMREAD_COLOR)
    return len(idx)


def cv2_processes(files, seconds, procs):
    # spawn, not fork: a child forked after OpenCV started its thread pool can deadlock in it.
    with mp.get_context("spawn").Pool(procs, initializer=_cv2_init, initargs=(files,)) as pool:
        chunks = [list(range(k, len(files), procs)) for k in range(procs)]
        pool.map(_cv2_chunk, chunks)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            n += sum(pool.map(_cv2_chunk, chunks))
        return n / (time.perf_counter() - t0)


def peers(files, batch, seconds):
    """name -> images/s, or a string saying why not measured."""
    import torch
    from workloads import full_batches

    out = {}
    batches = full_batches(files, batch)
    sync = torch.cuda.synchronize
    try:
        import torchvision
        from torchvision.io import decode_jpeg as tv_decode

        tbatches = [[torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in b] for b in batches]
        out[f"torchvision {torchvision.__version__} decode_jpeg cuda"] = _rate(
            lambda b: tv_decode(b, device="cuda"), tbatches, seconds, sync)
    except Exception as e:  # noqa: BLE001
        out["torchvision decode_jpeg cuda"] = f"not run: {type(e).__name__}: {e}"
    try:
        from nvidia import nvimgcodec

        ver = getattr(nvimgcodec, "__version__", "")
        hw = nvimgcodec.Decoder(backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY)])
        out[f"nvImageCodec {ver} hardware"] = _rate(lambda b: hw.decode(b), batches, seconds, sync)
        default = nvimgcodec.Decoder()
        out[f"nvImageCodec {ver} default"] = _rate(lambda b: default.decode(b), batches, seconds, sync)
    except Exception as e:  # noqa: BLE001
        out["nvImageCodec"] = f"not run: {type(e).__name__}: {e}"
    try:
        import nvidia.dali as dali
        from nvidia.dali import fn, pipeline_def, types

        for load in (0.65, 1.0):
            state = {"i": 0}

            def source():
                b = batches[state["i"] % len(batches)]
                state["i"] += 1
                return [np.frombuffer(f, np.uint8) for f in b]

            @pipeline_def(batch_size=batch, num_threads=os.cpu_count(), device_id=0, prefetch_queue_depth=2)
            def pipe():
                jpegs = fn.external_source(source=source, batch=True)
                return fn.decoders.image(jpegs, device="mixed", output_type=types.RGB, hw_decoder_load=load)

            p = pipe()
            p.build()
            out[f"DALI {dali.__version__} mixed, hw_decoder_load {load}"] = _rate(
                lambda b: p.run(), batches, seconds, sync)
            del p
    except Exception as e:  # noqa: BLE001
        out["DALI mixed"] = f"not run: {type(e).__name__}: {e}"
    return out


def orbbec_rates(files, batch, seconds, quick=False):
    import torch

    import orbbec.io as oio
    from workloads import DecodeAhead, full_batches

    batches = full_batches(files, batch)
    sync = torch.cuda.synchronize
    dev = torch.device("cuda")
    out = {}
    for name, path in (("orbbec hardware engine only", 0), ("orbbec hybrid only", 1)):
        out[name] = _rate(lambda b: oio._decode_cuda(b, "RGB", [None] * len(b), False, dev, path), batches, seconds,
                          sync, name)
    out["orbbec decode_jpeg cuda"] = _rate(lambda b: oio.decode_jpeg(b), batches, seconds, sync, "default")
    ahead = DecodeAhead(in_flight=2)  # (two in flight: the row below names it one batch ahead)

    def take_last_and_sync():
        ahead.drain()
        sync()
    out["orbbec start_decode, one batch ahead"] = _rate(ahead, batches, seconds, take_last_and_sync, "start_decode")
    if quick:
        print(f"  {out}", flush=True)
        return out
    out["orbbec decode_jpeg cpu (all cores)"] = _rate(lambda b: oio.decode_jpeg(b, device="cpu"), batches[:2],
                                                      seconds, lambda: None)
    for k, v in out.items():
        print(f"  {k}: {v}", flush=True)
    return out


def roi_rates(files, batch, seconds):
    """Full decode vs a random RandomResizedCrop-like region per image (area 8-100%, ratio 3/4-4/3)."""
    import torch

    import orbbec.io as oio
    from workloads import full_batches

    rng = np.random.default_rng(11)
    w, h = 1920, 1080
    rois = []
    for _ in files:
        area = rng.uniform(0.08, 1.0) * w * h
        ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        cw, ch = min(w, int(round(np.sqrt(area * ratio)))), min(h, int(round(np.sqrt(area / ratio))))
        rois.append((int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1)), cw, ch))
    idx = full_batches(list(range(len(files))), batch)
    sync = torch.cuda.synchronize
    full = _rate(lambda b: oio.decode_jpeg([files[i] for i in b]), idx, seconds, sync)
    roi = _rate(lambda b: oio.decode_jpeg([files[i] for i in b], roi=[rois[i] for i in b]), idx, seconds, sync)
    return {"full images": full, "RandomResizedCrop region only (roi=)": roi,
            "mean region area": float(np.mean([r[2] * r[3] for r in rois]) / (w * h))}


def pixel_rows(name, sampling, files):
    import cv2
    import torch

    import orbbec.io as oio

    out = oio.decode_jpeg(files, mode="BGR")
    diffs = []
    for f, img in zip(files, out):
        ref = cv2.imdecode(np.frombuffer(f, np.uint8), cv2.IMREAD_COLOR)
        diffs.append(np.abs(img.cpu().numpy().astype(np.int16) - ref.astype(np.int16)))
    d = np.concatenate([x.ravel() for x in diffs])
    torch.cuda.synchronize()
    return {"set": name, "sampling": sampling, "images": len(files), "mean": float(d.mean()),
            "p99.9": float(np.quantile(d, 0.999)), "max": int(d.max()), "equal": float((d == 0).mean())}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--sets", default="jpeg-1080p,jpeg-500x375")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--quick", action="store_true", help="orbbec's GPU rates only (no peers, cv2, pixels, roi)")
    ap.add_argument("--json", default=None, help="write all results here")
    ap.add_argument("--md", default=None, help="write the markdown table here")
    ap.add_argument("--plot", default=None, help="write the bar chart here (PNG)")
    args = ap.parse_args()

    import cv2
    import torch

    import orbbec
    import orbbec.io as oio
    from workloads import JPEG_SETS, jpeg_set

    gpu = torch.cuda.get_device_name()
    env = (f"{gpu}, {os.cpu_count()} host cores, torch {torch.__version__}, CUDA {torch.version.cuda}, "
           f"cv2 {cv2.__version__}, orbbec built with CUDA {orbbec.get_compiling_cuda_version()}")
    print(env, flush=True)
    results = {"env": env, "sets": {}, "pixels": [], "roi": None}
    for name in args.sets.split(","):
        w, h, batch, count = JPEG_SETS[name]
        files = jpeg_set(name)
        rates = {}
        rates.update(orbbec_rates(files, batch, args.seconds, args.quick))
        stats = oio.decoder_stats()
        print(f"  decoder stats: {stats}", flush=True)
        if args.quick:
            continue
        if not args.no_peers:
            rates.update(peers(files, batch, args.seconds))
        rates[f"cv2.imdecode, {os.cpu_count()} processes"] = cv2_processes(files, args.seconds, os.cpu_count())
        rates["cv2.imdecode, 1 process"] = cv2_processes(files, args.seconds, 1)
        results["sets"][name] = {"batch": batch, "images": count, "decoder_stats": stats,
                                 "mean_kB": float(np.mean([len(f) for f in files]) / 1e3), "rates": rates}
        for k, v in rates.items():
            print(f"{name:14s} {k:55s} {v if isinstance(v, str) else f'{v:10.0f} img/s'}", flush=True)
        results["pixels"].append(pixel_rows(name, "420", files[:64]))
    if args.quick:
        return
    small = "jpeg-500x375"
    for s in ("444", "422", "440"):
        results["pixels"].append(pixel_rows(small, s, jpeg_set(small, 64, sampling=s)))
    for row in results["pixels"]:
        print("pixels vs cv2:", row, flush=True)
    files = jpeg_set("jpeg-1080p")
    results["roi"] = roi_rates(files, 64, args.seconds)
    print("roi (1080p):", results["roi"], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.md:
        write_markdown(results, args.md)
    if args.plot:
        write_plot(results, args.plot)


def write_markdown(r, path):
    sets = list(r["sets"])
    names = []
    for s in sets:
        names += [k for k in r["sets"][s]["rates"] if k not in names]
    lines = [f"Measured on {r['env']}.", "", "Images/s (higher is better); batches as in the set.", "",
             "| decoder | " + " | ".join(f"{s} (batch {r['sets'][s]['batch']}, ~{r['sets'][s]['mean_kB']:.0f} kB)" for s in sets) + " |",
             "|---|" + "---:|" * len(sets)]
    for n in names:
        cells = []
        for s in sets:
            v = r["sets"][s]["rates"].get(n, "")
            cells.append(f"{v:,.0f}" if isinstance(v, float) else str(v))
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += ["", "Pixels against cv2.imdecode (uint8 BGR, absolute difference in levels):", "",
              "| set | sampling | images | mean | 99.9th percentile | max | equal |", "|---|---|---:|---:|---:|---:|---:|"]
    for p in r["pixels"]:
        lines.append(f"| {p['set']} | 4:{p['sampling'][1]}:{p['sampling'][2]} | {p['images']} | {p['mean']:.3f} | "
                     f"{p['p99.9']:.0f} | {p['max']} | {100 * p['equal']:.1f}% |")
    roi = r["roi"]
    lines += ["", f"Region-of-interest decoding, jpeg-1080p, batches of 64 (mean region {100 * roi['mean region area']:.0f}% "
              "of the image):", "", "| decode | images/s |", "|---|---:|",
              f"| full images | {roi['full images']:,.0f} |",
              f"| RandomResizedCrop region only (roi=) | {roi['RandomResizedCrop region only (roi=)']:,.0f} |", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def write_plot(r, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(r["sets"])
    fig, axes = plt.subplots(1, len(sets), figsize=(7 * len(sets), 5))
    for ax, s in zip(np.atleast_1d(axes), sets):
        items = [(k, v) for k, v in r["sets"][s]["rates"].items() if isinstance(v, float)]
        items.sort(key=lambda kv: kv[1])
        ax.barh([k for k, _ in items], [v for _, v in items],
                color=["tab:orange" if k.startswith("orbbec") else "tab:gray" for k, _ in items])
        ax.set_title(f"{s}, batch {r['sets'][s]['batch']}")
        ax.set_xlabel("images/s")
    fig.suptitle("JPEG decoding, " + r["env"].split(",")[0])
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
