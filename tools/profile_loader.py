"""Where a training step's input time goes, and what orbbec's loader changes.

1. Stages: for the JPEGs of a dataset, the time per image of each stage of a CPU input pipeline
   (read, decode with cv2, augment with cv2.warpAffine, normalise, collate, host-to-device copy), in
   one process, and the images/s that N DataLoader workers could reach at best.
2. Steps: the same training step (a torchvision model, AMP, SGD) fed three ways: by synthetic data
   already on the GPU (the ceiling), by a torch DataLoader doing stage 1 in workers, and by
   orbbec.data.GPULoader; images/s, and from CUDA events on the training stream the GPU time of a
   step and the gap between one step's end and the next one's start (the time the GPU waits for the
   next batch or for the host's launches). The loop syncs the host once at the end, as a training
   loop that logs every N steps does; SGD is torch's fused one, with which GradScaler does not sync
   the host either. `--optimizer sgd --sync-each-step` gives the loop that syncs the host every step
   (GradScaler's check for infinities with the unfused optimizer, plus a wait for each step's end).
   Under each mode, the process's garbage collections over the timed steps (a full one holds the GIL:
   no launch, no loader thread, for its whole time).

    python tools/profile_loader.py [--data-dir IMAGEFOLDER] [--model resnet50] [--batch-size 256] [--workers 8]

Without --data-dir the benchmark's ImageNet-like JPEG set (docs/workloads.md, jpeg-500x375) is used,
repeated to 64 batches per epoch.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
# Imported before anything starts CUDA, as a training script should: orbbec then gives CUDA's streams
# their own work queues (orbbec/common/cuda_connections.py).
from orbbec.io import decoder_stats  # noqa: E402
from loaded_libraries import mapped_library  # noqa: E402
from gc_pauses import Collections  # noqa: E402

MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def items_of(data_dir, batch):
    """The dataset's (JPEG, label) items; the benchmark's set (1,024 JPEGs) repeated to 64 batches
    per epoch (workloads.repeat_to_epoch)."""
    from train_ddp import image_items
    from workloads import repeat_to_epoch

    items = image_items(data_dir)
    return items if data_dir else repeat_to_epoch(items, batch)


def _bytes(x):
    from orbbec.io import read_file

    return read_file(x) if isinstance(x, (str, os.PathLike)) else x


class Cv2Dataset:
    """A typical CPU pipeline: read, cv2 decode, RandomResizedCrop + flip as one warp, normalise."""

    def __init__(self, items, transform):
        self.items, self.transform = items, transform

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i, times=None):
        import cv2
        import torch

        from orbbec.io._buffers import jpeg_size

        cv2.setNumThreads(1)
        t = [time.perf_counter()]
        data = _bytes(self.items[i][0])
        t.append(time.perf_counter())
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        t.append(time.perf_counter())
        p = self.transform.draw([jpeg_size(data)], [i])
        out = cv2.warpAffine(img, p.matrices[0].numpy(), (224, 224), flags=cv2.INTER_LINEAR)
        t.append(time.perf_counter())
        x = torch.from_numpy(np.ascontiguousarray(((out[:, :, ::-1] / np.float32(255) - MEAN) / STD).transpose(2, 0, 1)))
        t.append(time.perf_counter())
        if times is not None:
            times.append(np.diff(t))
        return x, self.items[i][1]


def stages(items, transform, batch, workers):
    import torch

    ds = Cv2Dataset(items, transform)
    times = []
    n = min(len(items), 4 * batch)
    samples = [ds.__getitem__(i, times) for i in range(n)]
    per = np.mean(times, axis=0) * 1e3
    t0 = time.perf_counter()
    for k in range(0, n - batch + 1, batch):
        torch.utils.data.default_collate(samples[k:k + batch])
    collate = (time.perf_counter() - t0) / n * 1e3
    x = torch.utils.data.default_collate(samples[:batch])[0].pin_memory()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        x.cuda(non_blocking=True)
    torch.cuda.synchronize()
    h2d = (time.perf_counter() - t0) / (5 * batch) * 1e3
    rows = [("read", per[0]), ("decode (cv2)", per[1]), ("augment (cv2.warpAffine)", per[2]),
            ("normalise", per[3]), ("collate", collate), ("host-to-device copy", h2d)]
    total = sum(v for _, v in rows[:5])
    print(f"\nStages, ms per image (one process; {n} images):")
    for name, v in rows:
        print(f"  {name:28s} {v:7.3f}  ({100 * v / (total + h2d):4.1f}%)")
    print(f"  => {workers} workers reach at most {workers * 1e3 / total:,.0f} images/s; orbbec moves decode, augment, "
          "normalise and the copy to the GPU, leaving read (and parameter drawing) to the workers.")


def training_step(model_name, dev, fused=False, compile_mode=None):
    """One training step of a torchvision model (AMP float16 with GradScaler, channels_last, SGD) as
    a function of the batch (x, y); the model and optimiser live in it. With the unfused SGD,
    GradScaler.step syncs the host (it reads the check for infinities); the fused one takes the check
    on the GPU. `compile_mode` compiles the model with torch.compile (reduce-overhead: inductor's
    kernels replayed as CUDA graphs, so the host launches a few graphs per step instead of hundreds
    of kernels)."""
    import torch
    import torchvision

    model = getattr(torchvision.models, model_name)().to(dev, memory_format=torch.channels_last)
    net = torch.compile(model, mode=compile_mode) if compile_mode else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=fused)
    scaler = torch.amp.GradScaler()
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(net(x.contiguous(memory_format=torch.channels_last)), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return step


def synthetic_batches(batch_size, dev):
    """The same random batch on the GPU, forever (the training step's ceiling)."""
    import torch

    x = torch.randn(batch_size, 3, 224, 224, device=dev)
    y = torch.randint(0, 1000, (batch_size,), device=dev)
    while True:
        yield x, y


def steps(args, items, transform):
    import torch

    from orbbec.data import GPULoader

    dev = torch.device("cuda")
    ld = None
    train = training_step(args.model, dev, fused=args.optimizer == "sgd-fused", compile_mode=args.compile)

    def synthetic():
        return synthetic_batches(args.batch_size, dev)

    def dataloader():
        dl = torch.utils.data.DataLoader(Cv2Dataset(items, transform), args.batch_size, shuffle=True, drop_last=True,
                                         num_workers=args.workers, pin_memory=True, persistent_workers=True,
                                         prefetch_factor=4)
        while True:
            for x, y in dl:
                yield x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)

    def orbbec():
        nonlocal ld
        ld = GPULoader(items, args.batch_size, transform=transform, shuffle=True, drop_last=True,
                       num_workers=args.orbbec_workers, prefetch=args.prefetch)
        while True:
            for x, y in ld:
                yield x, y.to(dev, non_blocking=True)

    sync = "the host synced every step" if args.sync_each_step else "one host sync at the end"
    compiled = f", torch.compile(mode={args.compile!r})" if args.compile else ""
    print(f"\nTraining steps: {args.model}, batch {args.batch_size}, AMP, channels_last, {args.optimizer}, {sync}"
          f"{compiled}")
    modes = {"synthetic": ("synthetic data on the GPU", synthetic),
             "dataloader": (f"DataLoader, {args.workers} workers", dataloader),
             "orbbec": (f"orbbec GPULoader, {args.orbbec_workers} workers", orbbec)}
    if args.train_priority is not None:
        s = torch.cuda.Stream(priority=args.train_priority)
        print(f"  (training on a stream of priority {s.priority})")
        torch.cuda.synchronize()  # the model was made on the default stream
        torch.cuda.set_stream(s)
    feeds = {}  # a mode named twice (--modes synthetic,orbbec,synthetic,orbbec) goes on with its feed
    rates = {}
    for name in args.modes.split(","):
        label, source = modes[name]
        if name not in feeds:
            if source is orbbec:
                decoder_alone(items, args.batch_size)
            feeds[name] = source()
        stats0 = decoder_stats() if source is orbbec else None
        rate, step_ms, gap_ms, clocks, collections = timed_steps(feeds[name], train, args.warmup, args.steps,
                                                                 args.sync_each_step)
        rates.setdefault(name, []).append(rate)
        print(f"  {label:34s} {rate:8,.0f} images/s   GPU per step {step_ms:6.1f} ms, "
              f"gap between steps {gap_ms:5.2f} ms", flush=True)
        if clocks:
            print(f"    the GPU over the timed steps: {clocks}", flush=True)
        print(f"    {collections}", flush=True)
        if source is orbbec and ld is not None:
            print(f"    orbbec loader, seconds per batch: {ld.timing()}", flush=True)
            stats1 = decoder_stats()
            _print_decoder_phases("beside the training step", stats0["host_seconds"], stats1["host_seconds"])
            mem0, mem1 = stats0.get("memory_calls", {}), stats1.get("memory_calls", {})
            print("    nvJPEG's memory calls over this run of the mode (warm-up steps included): "
                  + ", ".join(f"{k} {mem1[k] - mem0.get(k, 0)}" for k in mem1), flush=True)
    advice = loader_advice(rates.get("synthetic"), rates.get("orbbec"), args.decoder)
    if advice:
        print("\n" + advice)


def loader_advice(synthetic, orbbec, decoder):
    """What to change, from the mean images/s of the step on synthetic data and fed by orbbec's
    loader (lists, one rate per timed run of the mode), and the decoder setting used."""
    if not synthetic or not orbbec:
        return None
    from orbbec.common import cuda_connections

    share = np.mean(orbbec) / np.mean(synthetic)
    head = f"orbbec's loader fed the step at {share:.0%} of its speed on synthetic data"
    if share >= 0.95:
        return head + "."
    queues = cuda_connections.advice()
    if queues:  # CUDA started before orbbec's import: that first
        return head + ". " + queues + "."
    if decoder == "default":
        return (head + ". With the default decoder the hardware engine's and its threads' work slows the "
                "step; try --decoder training (orbbec.io.configure_decoder(hardware_engine=False, threads=6) "
                "in your script), docs/data.md, 'Beside a training step'.")
    return (head + " with the training setting. If the loader's timing() shows little waiting for the "
            "consumer, the loader is behind the step: keep the default decoder or add workers.")


def timed_steps(feed, train, warmup, steps, sync_each_step):
    """images/s over `steps` training steps after `warmup` ones; from events on the training stream,
    the mean GPU time of a step and the mean gap from one step's end to the next one's start; the
    GPU's clock and power over those steps (gpu_clocks), or None without nvidia-smi; and the process's
    garbage collections over those steps (gc_pauses)."""
    import torch
    from gpu_clocks import GpuClocks

    for _ in range(warmup):
        train(*next(feed))
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    n, t0 = 0, time.perf_counter()
    with GpuClocks(torch.cuda.current_device()) as clocks, Collections() as collections:
        for k in range(steps):
            x, y = next(feed)  # the training stream waits here for the loader's batch: inside the gap
            starts[k].record()
            train(x, y)
            ends[k].record()
            n += x.shape[0]
            if sync_each_step:
                ends[k].synchronize()
        torch.cuda.synchronize()
    rate = n / (time.perf_counter() - t0)
    step_ms = np.mean([s.elapsed_time(e) for s, e in zip(starts, ends)])
    gap_ms = np.mean([e.elapsed_time(s) for e, s in zip(ends[:-1], starts[1:])])
    return rate, step_ms, gap_ms, clocks.summary(), collections.summary()


def _print_decoder_phases(label, before, after):
    """The GPU decoder's host time per call between two decoder_stats() readings, by phase."""
    calls = after["calls"] - before["calls"]
    if calls <= 0:
        return
    per = {k: (after[k] - before[k]) / calls * 1e3 for k in after if k != "calls"}
    total = per["parse"] + per["allocate"] + per["jobs"] + per["finish"]
    print(f"    decoder host ms per batch, {label} ({calls} calls): {total:.1f} = "
          + ", ".join(f"{k} {per[k]:.2f}" for k in ("parse", "allocate", "jobs", "finish"))
          + f"; in the jobs: lane wait {per['lane_wait']:.2f}, lane submit {per['lane_submit']:.2f}, "
          f"hybrid {per['hybrid']:.2f} (summed over threads)", flush=True)


def decoder_alone(items, batch, calls=20):
    """The decoder's phases on the same JPEGs back to back, without the training step beside it."""
    import torch

    from orbbec.io import decode_jpeg
    from workloads import full_batches

    data = [_bytes(x[0]) for x in items[:batch * 4]]
    batches = full_batches(data, batch)
    for b in batches:
        decode_jpeg(b)
    torch.cuda.synchronize()
    before = decoder_stats()["host_seconds"]
    for k in range(calls):
        decode_jpeg(batches[k % len(batches)])
    torch.cuda.synchronize()
    _print_decoder_phases("alone", before, decoder_stats()["host_seconds"])
    print(f"    nvJPEG loaded from {mapped_library('libnvjpeg.so') or 'an unknown place'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--orbbec-workers", type=int, default=4)
    ap.add_argument("--prefetch", type=int, default=3, help="orbbec's batches prepared ahead")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--skip-stages", action="store_true")
    ap.add_argument("--modes", default="synthetic,dataloader,orbbec",
                    help="which feeds of the training step to time, in order; a mode named again is timed again")
    ap.add_argument("--optimizer", choices=("sgd-fused", "sgd"), default="sgd-fused",
                    help="sgd: the unfused SGD, with which GradScaler syncs the host every step")
    ap.add_argument("--compile", default=None, help="torch.compile the model with this mode (e.g. reduce-overhead)")
    ap.add_argument("--sync-each-step", action="store_true", help="wait for each step's end on the host")
    ap.add_argument("--decoder", choices=("default", "training"), default="default",
                    help="training: orbbec.io.configure_decoder(**orbbec.io.TRAINING_DECODER), the setting "
                         "docs/data.md gives for a loader beside a training step")
    ap.add_argument("--train-priority", type=int, default=None,
                    help="run every mode's training step on a stream of this CUDA priority (lower is higher)")
    ap.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval (seconds)")
    args = ap.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    if args.decoder == "training":
        import orbbec.io

        orbbec.io.configure_decoder(**orbbec.io.TRAINING_DECODER)

    import orbbec.augment as A

    items = items_of(args.data_dir, args.batch_size)
    transform = A.Compose([A.RandomResizedCrop(224), A.RandomHorizontalFlip(),
                           A.Normalize(A.IMAGENET_MEAN, A.IMAGENET_STD)])
    if not args.skip_stages:
        stages(items, transform, args.batch_size, args.workers)
    steps(args, items, transform)


if __name__ == "__main__":
    main()
