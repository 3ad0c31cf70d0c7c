"""The training input pipeline end to end, JPEG bytes in memory -> normalised float NCHW batch on the
GPU, images/s, orbbec.data.GPULoader beside its peers in one run on one GPU.

Workloads (tools/workloads.py PIPELINE_WORKLOADS, docs/workloads.md): cls-1080p, cls-500x375
(RandomResizedCrop 224 + flip + normalise), face (250 x 250 -> 112 x 112 aligned on 5 landmarks + flip
+ normalise), det (640 x 640 random affine + flip + normalise, boxes follow). Every pipeline draws
per-sample parameters and yields batches on the GPU; the clock runs `--seconds` after `--warmup`
seconds (and at least 4 batches) and stops after a device synchronise.

Pipelines, each in its own process (its own CPU time and GPU memory):
- orbbec: GPULoader (workers read bytes and draw parameters; nvJPEG decode + one warp with fused
  normalise on a side stream, prefetched), each JPEG decoded down to the last row its warp reads
  (partial_decode, its default; the share of rows decoded is printed under the table).
- orbbec (every row): the same with partial_decode=False.
- orbbec decode only: the GPU decoder alone, driven as the loader drives it (the ceiling): as many
  batches started (orbbec.io.start_decode) as the loader keeps in flight before the oldest is taken.
- DALI: external source of bytes; classification with decoders.image_random_crop (mixed) + resize +
  crop_mirror_normalize; face and det with decoders.image (mixed) + warp_affine on per-sample matrices
  (the same draws as orbbec's, made in the source callback) + crop_mirror_normalize; det boxes through
  coord_transform on the GPU. hw_decoder_load 0.65 (its default) and 1.0, each under 32 CUDA work
  queues (what orbbec's import sets, inherited by every child) and the driver's default 8
  (--dali-queues); DALIGenericIterator. The best of them is DALI's figure.
- torchvision: decode_jpeg(list, device="cuda") + v2 transforms per image on the GPU (per-sample
  randomness), stacked and normalised; face through affine_grid + grid_sample on the same matrices.
- CPU DataLoader: one worker per core, cv2.imdecode + cv2.warpAffine (same matrices) + normalise,
  pin_memory, copied to the GPU.

Columns: images/s; host cores busy (CPU time of the process and its workers / wall time); GPU memory
(device-wide memory in use at the end minus before the pipeline was built). The JSON and the log also
keep each run's machine-wide busy cores and steal share (time the hypervisor gave to others) over its
timed window, to tell a slow host from a slow pipeline.

A pipeline whose process has not ended within --timeout is killed and recorded as timed out (or, if
it had printed its figures, kept and flagged), with its threads' states, kernel waits and stacks in
$TMPDIR/orbbec_pipeline_stall_<workload>_<pipeline>.txt.

    python tools/benchmark_pipeline.py [--seconds 4] [--workloads cls-500x375,...] [--md docs/benchmark_pipeline.md]
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from loaded_libraries import mapped_library  # noqa: E402
from pipeline_table import write_outputs  # noqa: E402

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
PIPELINES = ["orbbec", "orbbec (every row)", "orbbec decode only", "DALI", "torchvision", "CPU DataLoader"]


# ---------------------------------------------------------------- data and transforms (shared)
def build_data(workload):
    from workloads import PIPELINE_WORKLOADS, det_boxes, face_landmarks, jpeg_set, repeat_to_epoch

    set_name, batch, _ = PIPELINE_WORKLOADS[workload]
    files = jpeg_set(set_name)
    items = []
    lms = face_landmarks(len(files)) if workload == "face" else None
    boxes = det_boxes(len(files)) if workload == "det" else None
    for i, f in enumerate(files):
        item = {"image": f, "label": i}
        if lms is not None:
            item["landmarks"] = lms[i]
        if boxes is not None:
            item["boxes"] = boxes[i]
        items.append(item)
    return repeat_to_epoch(items, batch), batch  # every pipeline reads the same list


def orbbec_transform(workload, normalize=True):
    import orbbec.augment as A

    if workload.startswith("cls"):
        ts = [A.RandomResizedCrop(224), A.RandomHorizontalFlip()]
    elif workload == "face":
        ts = [A.AlignFaces(112), A.RandomHorizontalFlip()]
    else:
        ts = [A.RandomAffine(10, (0.1, 0.1), (0.75, 1.25)), A.RandomHorizontalFlip()]
    return A.Compose(ts + ([A.Normalize(MEAN, STD)] if normalize else []))


def draws(items, indices, workload, seed=0):
    """orbbec's per-sample parameters for items (matrices [B, 2, 3], output (h, w)), drawn on the CPU."""
    from orbbec.io._buffers import jpeg_size

    tf = orbbec_transform(workload, normalize=False)
    sizes = [jpeg_size(items[i]["image"]) for i in indices]
    p = tf.draw(sizes, list(indices), seed=seed, targets=[items[i] for i in indices])
    return p


# ---------------------------------------------------------------- measuring
def proc_stat(path):
    """(ppid, [utime, stime, cutime, cstime] in clock ticks) of a /proc/<pid>[/task/<tid>]/stat file."""
    with open(path) as f:
        s = f.read()
    fields = s[s.rindex(")") + 2:].split()
    return int(fields[1]), [int(x) for x in fields[11:15]]


def _cpu_seconds():
    """CPU time of this process, its finished children and its live descendants."""
    tck = os.sysconf("SC_CLK_TCK")
    procs = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                procs[int(pid)] = proc_stat(f"/proc/{pid}/stat")
            except (OSError, ValueError, IndexError):
                pass
    me = os.getpid()
    total, stack = sum(procs[me][1]), [me]
    while stack:
        parent = stack.pop()
        for pid, (ppid, t) in procs.items():
            if ppid == parent:
                total += sum(t)
                stack.append(pid)
    return total / tck


def machine_jiffies():
    """/proc/stat's machine-wide (busy, steal, total) clock ticks."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v[:3]) + sum(v[5:7]), v[7], sum(v)


def machine_share(before, after) -> dict:
    """The machine between two machine_jiffies() readings: cores busy (all processes) and the share
    of time the hypervisor gave to others (steal), which slows a round without the pipeline at fault."""
    total = max(after[2] - before[2], 1)
    return {"machine_cores_busy": os.cpu_count() * (after[0] - before[0]) / total,
            "steal": (after[1] - before[1]) / total}


MACHINE = {}  # machine_share() of the last measure()'s timed window


# Seconds of warm-up before the clock starts (--warmup, set in each child), the same for every
# pipeline: what is compared is the steady state. A loader's first seconds run slower than its steady
# state, for longer on large images (H100, tools/dev/loader_stage_probe.py --windows 5 --seconds 1.5,
# cls-1080p: 1,305 / 5,732 / 5,904 / 6,282 / 7,112 img/s in consecutive windows of one process).
WARMUP_S = 5.0


def measure(step, seconds, warmup=4, on_start=None, warmup_s=None):
    """images/s and host cores busy of `step()` (returns the images of one batch) run back to back,
    after at least `warmup` batches and `warmup_s` seconds (default WARMUP_S) of it."""
    import torch

    warmup_s = WARMUP_S if warmup_s is None else warmup_s
    done, t = 0, time.perf_counter()
    while done < warmup or time.perf_counter() - t < warmup_s:
        step()
        done += 1
    torch.cuda.synchronize()
    if on_start is not None:
        on_start()
    n, t0, c0, j0 = 0, time.perf_counter(), _cpu_seconds(), machine_jiffies()
    while time.perf_counter() - t0 < seconds:
        n += step()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    MACHINE.update(machine_share(j0, machine_jiffies()))
    return n / wall, (_cpu_seconds() - c0) / wall


def forever(make_iter):
    while True:
        yield from make_iter()


# ---------------------------------------------------------------- the pipelines
def run_orbbec(workload, items, batch, seconds, workers, partial_decode=True):
    from orbbec.data import GPULoader

    loader = GPULoader(items, batch, transform=orbbec_transform(workload), shuffle=True, num_workers=workers,
                       prefetch=4, drop_last=True, seed=0, partial_decode=partial_decode)
    it = forever(lambda: iter(loader))

    def step():
        b = next(it)
        return b["image"].shape[0]
    def warmed_up():
        loader.timing(reset=True)
    rate, cores = measure(step, seconds, on_start=warmed_up)
    print("loader timing (s per batch):", loader.timing(), file=sys.stderr, flush=True)
    return rate, cores


def rows_to_decode_of(items, indices, workload):
    """(JPEG frame headers, the loader's partial_decode rows) of items[indices] under one draw each."""
    from orbbec.data._rows import rows_to_decode
    from orbbec.io._buffers import jpeg_frame

    p = draws(items, indices, workload)
    frames = [jpeg_frame(items[i]["image"]) for i in indices]
    return frames, rows_to_decode(p.matrices.numpy(), p.size, frames)


def rows_decoded(workload, items, n=2048):
    """The share of the JPEGs' rows the loader's partial decode decodes, over the first n items."""
    frames, rows = rows_to_decode_of(items, list(range(min(n, len(items)))), workload)
    return sum(f.height if r is None else r for f, r in zip(frames, rows)) / sum(f.height for f in frames)


def run_decode_only(workload, items, batch, seconds, workers):
    """The GPU decoder alone, driven as the loader drives it (as many batches started as it keeps in
    flight before the oldest is taken), from bytes already in memory."""
    from workloads import full_batches

    return decode_ahead(full_batches([it["image"] for it in items], batch), seconds)


def decode_ahead(batches, seconds):
    """images/s (and host cores busy) of the GPU decoder on `batches` in turn (lists of encoded
    images or orbbec.io.PackedImages), started as the loader starts them (workloads.DecodeAhead)."""
    from workloads import DecodeAhead

    state = {"i": 0}
    ahead = DecodeAhead()

    def step():
        b = batches[state["i"] % len(batches)]
        state["i"] += 1
        return ahead(b)  # the images of the batch taken, as a loader counts the batches it hands out
    return measure(step, seconds)


def _dali_matrix(m):
    """cv2's pixel-centre convention -> DALI's (pixel centres at +0.5)."""
    a, t = m[:, :2], m[:, 2]
    return np.concatenate([a, (t + 0.5 - a @ np.array([0.5, 0.5]))[:, None]], 1).astype(np.float32)


def run_dali(workload, items, batch, seconds, workers, hw_load=0.65):
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import math as dmath
    from nvidia.dali import pipeline_def
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    files = [np.frombuffer(it["image"], np.uint8) for it in items]  # (the repeated list: views, no copies)
    n_batches = len(files) // batch
    state = {"i": 0}
    mean, std = [255 * m for m in MEAN], [255 * s for s in STD]

    def source():
        k = state["i"] % n_batches
        state["i"] += 1
        idx = list(range(k * batch, (k + 1) * batch))
        jpegs = [files[i] for i in idx]
        if workload.startswith("cls"):
            return (jpegs,)
        p = draws(items, idx, workload, seed=state["i"])
        mats = [np.ascontiguousarray(_dali_matrix(m)) for m in p.matrices.numpy()]
        if workload == "face":
            return jpegs, mats
        corners = []
        for i in idx:
            b = items[i]["boxes"]
            corners.append(np.ascontiguousarray(
                np.stack([b[:, [0, 1]], b[:, [2, 1]], b[:, [0, 3]], b[:, [2, 3]]], 1).reshape(-1, 2), np.float32))
        return jpegs, mats, corners

    outputs = {"cls": 1, "face": 2, "det": 3}[workload.split("-")[0]]

    @pipeline_def(batch_size=batch, num_threads=os.cpu_count(), device_id=0, prefetch_queue_depth=3)
    def pipe():
        if outputs == 1:
            srcs = [fn.external_source(source=lambda: source()[0], batch=True)]
        else:
            srcs = fn.external_source(source=source, num_outputs=outputs, batch=True)
        jpegs = srcs[0]
        if workload.startswith("cls"):
            imgs = fn.decoders.image_random_crop(jpegs, device="mixed", output_type=types.RGB,
                                                 random_area=[0.08, 1.0], random_aspect_ratio=[0.75, 4 / 3],
                                                 hw_decoder_load=hw_load)
            imgs = fn.resize(imgs, resize_x=224, resize_y=224, interp_type=types.INTERP_LINEAR)
            return fn.crop_mirror_normalize(imgs, dtype=types.FLOAT, output_layout="CHW", mean=mean, std=std,
                                            mirror=fn.random.coin_flip())
        imgs = fn.decoders.image(jpegs, device="mixed", output_type=types.RGB, hw_decoder_load=hw_load)
        size = [112, 112] if workload == "face" else [640, 640]
        imgs = fn.warp_affine(imgs, matrix=srcs[1], size=size, inverse_map=False, fill_value=0,
                              interp_type=types.INTERP_LINEAR)
        out = fn.crop_mirror_normalize(imgs, dtype=types.FLOAT, output_layout="CHW", mean=mean, std=std)
        if workload == "face":
            return out
        pts = fn.coord_transform(srcs[2].gpu(), MT=srcs[1])
        pts = fn.reshape(pts, shape=[-1, 4, 2])
        lo = dmath.clamp(fn.reductions.min(pts, axes=1), 0, 640)
        hi = dmath.clamp(fn.reductions.max(pts, axes=1), 0, 640)
        return out, fn.pad(fn.cat(lo, hi, axis=1), fill_value=0)  # padded: the iterator needs a dense batch

    p = pipe()
    p.build()
    names = ["image"] if workload != "det" else ["image", "boxes"]
    it = DALIGenericIterator([p], names, size=-1)

    def step():
        out = next(it)
        return out[0]["image"].shape[0]
    return measure(step, seconds)


def run_torchvision(workload, items, batch, seconds, workers):
    import torch
    import torch.nn.functional as F
    from torchvision import tv_tensors
    from torchvision.io import decode_jpeg
    from torchvision.transforms import v2

    files = [torch.frombuffer(bytearray(it["image"]), dtype=torch.uint8) for it in items]
    n_batches = len(files) // batch
    state = {"i": 0}
    mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1)
    std = torch.tensor(STD, device="cuda").view(1, 3, 1, 1)
    if workload.startswith("cls"):
        per_image = v2.Compose([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip()])
    elif workload == "det":
        per_image = v2.Compose([v2.RandomAffine(10, (0.1, 0.1), (0.75, 1.25)), v2.RandomHorizontalFlip()])

    def step():
        k = state["i"] % n_batches
        state["i"] += 1
        idx = range(k * batch, (k + 1) * batch)
        imgs = decode_jpeg([files[i] for i in idx], device="cuda")
        if workload == "face":
            p = draws(items, list(idx), workload, seed=state["i"])
            x = torch.stack(imgs).float()  # 250 x 250 each
            theta = _normalised_inverse(p.matrices, 250, 250, 112, 112).to("cuda", torch.float32)
            grid = F.affine_grid(theta, [batch, 3, 112, 112], align_corners=False)
            x = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False) / 255
        elif workload == "det":
            out = []
            for i, img in zip(idx, imgs):
                boxes = tv_tensors.BoundingBoxes(torch.from_numpy(items[i]["boxes"]).cuda(), format="XYXY",
                                                 canvas_size=(640, 640))
                out.append(per_image(img, boxes)[0])
            x = torch.stack(out).float() / 255
        else:
            x = torch.stack([per_image(img) for img in imgs]).float() / 255
        x = (x - mean) / std
        return x.shape[0]
    return measure(step, seconds)


def _normalised_inverse(M, in_h, in_w, out_h, out_w):
    """affine_grid's theta (output -> input in [-1, 1] coordinates, align_corners=False) from forward
    pixel-centre matrices [B, 2, 3]."""
    import torch

    B = M.shape[0]
    full = torch.cat([M, torch.tensor([0.0, 0.0, 1.0], dtype=M.dtype).expand(B, 1, 3)], 1)
    inv = torch.linalg.inv(full)

    def to_norm(h, w):  # pixel centre -> normalised coordinate
        return torch.tensor([[2 / w, 0, 1 / w - 1], [0, 2 / h, 1 / h - 1], [0, 0, 1]], dtype=M.dtype)
    return (to_norm(in_h, in_w) @ inv @ torch.linalg.inv(to_norm(out_h, out_w)))[:, :2]


class _Cv2Dataset:
    """What a CPU DataLoader worker does: cv2 decode, warp by the same matrices, normalise."""

    def __init__(self, items, workload):
        self.items, self.workload = items, workload
        self.size = {"face": (112, 112), "det": (640, 640)}.get(workload, (224, 224))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        import cv2
        import torch

        cv2.setNumThreads(1)
        p = draws(self.items, [i], self.workload)
        img = cv2.imdecode(np.frombuffer(self.items[i]["image"], np.uint8), cv2.IMREAD_COLOR)
        img = cv2.warpAffine(img, p.matrices[0].numpy(), (self.size[1], self.size[0]), flags=cv2.INTER_LINEAR)
        x = (img[:, :, ::-1].astype(np.float32) / 255 - MEAN) / STD
        return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1), dtype=np.float32)), i


def run_cpu_loader(workload, items, batch, seconds, workers):
    import torch

    ds = _Cv2Dataset(items, workload)
    loader = torch.utils.data.DataLoader(ds, batch, shuffle=True, num_workers=os.cpu_count(), pin_memory=True,
                                         drop_last=True, persistent_workers=True, prefetch_factor=4)
    it = forever(lambda: iter(loader))

    def step():
        x, _ = next(it)
        x = x.cuda(non_blocking=True)
        return x.shape[0]
    return measure(step, seconds)


RUNNERS = {"orbbec": run_orbbec, "orbbec (every row)": lambda *a: run_orbbec(*a, partial_decode=False),
           "orbbec decode only": run_decode_only, "DALI": run_dali,
           "torchvision": run_torchvision, "CPU DataLoader": run_cpu_loader}


def run_one(args):
    """In a child process: one pipeline on one workload; prints one JSON line."""
    import torch

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent's save_stacks on a timeout
    global WARMUP_S
    WARMUP_S = args.warmup
    with open(args.data, "rb") as f:
        items, batch = pickle.load(f)[args.workload]
    if args.run.startswith("orbbec"):
        import orbbec  # noqa: F401  (before CUDA starts, as a user's script: see orbbec/common/cuda_connections.py)
    torch.cuda.init()
    free0 = torch.cuda.mem_get_info()[0]
    kwargs = {"hw_load": args.hw_load} if args.run == "DALI" else {}
    rate, cores = RUNNERS[args.run](args.workload, items, batch, args.seconds, int(args.workers), **kwargs)
    used = (free0 - torch.cuda.mem_get_info()[0]) / 2**20
    result = {"rate": rate, "cores": cores, "gpu_mb": used, **MACHINE}
    if args.run == "orbbec":
        result["rows_decoded"] = rows_decoded(args.workload, items)
    if args.run.startswith("orbbec"):
        result["nvjpeg"] = mapped_library("libnvjpeg.so")
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)  # loaders' threads and workers need not be joined


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=WARMUP_S, help="seconds each pipeline runs before the clock starts")
    ap.add_argument("--workloads", default="cls-1080p,cls-500x375,face,det")
    ap.add_argument("--pipelines", default=",".join(PIPELINES))
    ap.add_argument("--workers", default="9,cls-500x375=24,face=32,det=32",
                    help="orbbec's DataLoader workers (reading bytes): N, or N plus per-workload counts "
                         "(9,face=32), as a user sets num_workers per dataset")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per pipeline before it counts as timed out")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every pipeline this many times, in alternated rounds; rows give the median run "
                         "and the range (a process's rate varies more than the pipelines differ on small images)")
    ap.add_argument("--rounds-of", default=None,
                    help="the pipelines measured in every round (default: all); the others once, in the first "
                         "round (e.g. \"orbbec,orbbec decode only\" for the loader's share of decoding alone)")
    ap.add_argument("--dali-queues", default="32,8",
                    help="CUDA work queues (CUDA_DEVICE_MAX_CONNECTIONS) DALI is measured under; its best counts")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    ap.add_argument("--plot", default=None, help="bar chart of images/s per workload (PNG)")
    ap.add_argument("--from-json", nargs="+", default=None,
                    help="write --md/--plot from earlier runs' --json files (merged in order) instead of running")
    ap.add_argument("--run", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--workload", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--hw-load", type=float, default=0.65, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:
        return run_one(args)
    if args.from_json:
        results, rounds = None, {}
        for path in args.from_json:
            with open(path) as f:
                r = json.load(f)
            rounds.update(dict.fromkeys(r["workloads"], r.get("rounds", 1)))
            if results is None:
                results = r
            else:
                results["workloads"].update(r["workloads"])
                results.setdefault("workers", {}).update(r.get("workers", {}))
        results["rounds"], results["rounds_by_workload"] = max(rounds.values()), rounds
        return write_outputs(results, args)

    import torch

    import orbbec
    from orbbec.common import cuda_connections

    env = (f"{torch.cuda.get_device_name()}, {os.cpu_count()} host cores, torch {torch.__version__}, "
           f"CUDA {torch.version.cuda}, orbbec built with CUDA {orbbec.get_compiling_cuda_version()}; "
           f"{cuda_connections.VARIABLE}={os.environ.get(cuda_connections.VARIABLE, 'unset')} "
           f"unless a row says otherwise")
    print(env, flush=True)
    workloads = args.workloads.split(",")
    data_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "orbbec_pipeline_data.pkl")
    with open(data_path, "wb") as f:
        pickle.dump({w: build_data(w) for w in workloads}, f)
    every_round = args.pipelines.split(",") if args.rounds_of is None else args.rounds_of.split(",")
    results = {"env": env, "seconds": args.seconds, "warmup_s": args.warmup, "rounds": args.rounds,
               "rounds_of": every_round if args.rounds > 1 and args.rounds_of else None,
               "workers": {w: workers_for(args.workers, w) for w in workloads}, "workloads": {}}
    for w in workloads:
        runs = {}  # label: its measurements, one per round (the rounds alternate the pipelines)
        for round_ in range(args.rounds):
            for name in args.pipelines.split(","):
                if round_ > 0 and name not in every_round:
                    continue
                variants = dali_variants(args.dali_queues) if name == "DALI" else [(name, None, None)]
                for label, load, queues in variants:
                    r = measure_child(args, name, w, data_path, label, load, queues)
                    runs.setdefault(label, []).append(r)
                    print(f"{w:12s} {label:30s} " + (f"{r['rate']:9.0f} img/s  {r['cores']:5.1f} cores  "
                                                     f"{r['gpu_mb']:7.0f} MB  steal {r.get('steal', 0):.1%}"
                                                     if "rate" in r else r["error"]), flush=True)
        results["workloads"][w] = {label: median_run(rs) for label, rs in runs.items()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    write_outputs(results, args)


def dali_variants(queues_spec: str):
    """(label, hw_decoder_load, CUDA work queues) of each DALI run: both decoder loads, under each
    queue count of --dali-queues. Every child inherits the 32 queues orbbec's import set in this
    process; DALI is measured with the driver's default 8 too, so that its best is its best."""
    from orbbec.common import cuda_connections

    queues = [int(q) for q in str(queues_spec).split(",")]
    return [(f"DALI, hw_decoder_load {load}" + ("" if q == cuda_connections.WANTED else f", {q} queues"), load, q)
            for q in queues for load in (0.65, 1.0)]


def measure_child(args, name, workload, data_path, label, hw_load, queues=None):
    """One pipeline measured in its own process: its RESULT figures, or {"error": why not}. `queues`:
    the child's CUDA_DEVICE_MAX_CONNECTIONS (else it inherits this process's)."""
    from orbbec.common import cuda_connections

    cmd = [sys.executable, os.path.abspath(__file__), "--run", name, "--workload", workload, "--data", data_path,
           "--seconds", str(args.seconds), "--warmup", str(args.warmup),
           "--workers", str(workers_for(args.workers, workload))]
    if hw_load is not None:
        cmd += ["--hw-load", str(hw_load)]
    env = None if queues is None else dict(os.environ, **{cuda_connections.VARIABLE: str(queues)})
    out, err, stall = run_child(cmd, args.timeout or 180 + 4 * args.seconds, f"{workload}-{label}", env)
    for x in err.splitlines():
        if x.startswith("loader timing"):
            print(f"  {x}", flush=True)
    line = [x for x in out.splitlines() if x.startswith("RESULT ")]
    if not line:
        return {"error": f"timed out (evidence in {stall})" if stall else
                (err.strip().splitlines() or ["no output"])[-1][:300]}
    result = json.loads(line[-1][7:])  # measured; a child that then did not end is recorded beside its figures
    if stall:
        result["exit"] = f"did not end after its result (evidence in {stall})"
        print(f"  WARNING: the child did not end after its result; evidence in {stall}", flush=True)
    return result


def workers_for(spec: str, workload: str) -> int:
    """The loader's workers for `workload` from --workers ("9" or "9,face=16")."""
    default, *pairs = str(spec).split(",")
    counts = dict(p.split("=") for p in pairs)
    return int(counts.get(workload, default))


def median_run(runs):
    """A pipeline's row over its rounds: the run of the median rate (the lower middle one of an even
    count), with every round's rate in "rates" and its steal share in "steals"; a run that failed is
    reported when none measured."""
    measured = sorted((r for r in runs if "rate" in r), key=lambda r: r["rate"])
    if not measured:
        return runs[-1]
    row = dict(measured[(len(measured) - 1) // 2])
    if len(runs) > 1:
        row["rates"] = [r.get("rate") for r in runs]
        row["steals"] = [r.get("steal") for r in runs]
    return row


def run_child(cmd, timeout, name, env=None):
    """(stdout, stderr, None), or when the child has not ended within `timeout` (stdout, stderr, a
    file with the evidence: the state and kernel wait of each of its threads and of the processes it
    started, every thread's native and Python stacks, its stderr), after which it is killed.

    The output goes to files, not pipes, and the child gets its own session: DataLoader workers left
    behind by its os._exit (they inherit its output) cannot keep this process waiting, and are
    killed with the session once the child has ended."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, start_new_session=True, env=env)
        path = None
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            path = _stall_evidence(proc.pid, name)
            proc.kill()
            proc.wait()
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        out.seek(0)
        err.seek(0)
        o, e = out.read(), err.read()
    if path:
        with open(path, "a") as f:
            f.write("\n--- the child's stderr (Python stacks last) ---\n" + e)
    return o, e, path


def _stall_evidence(pid, name):
    """What a child that has not ended is doing: its threads' and its session's processes' states and
    kernel waits (a child that has ended but not been reaped shows as a zombie), then the stacks."""
    from stacks import save_stacks

    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "orbbec_pipeline_stall_" +
                        "".join(c if c.isalnum() else "_" for c in name) + ".txt")
    with open(path, "w") as f:
        try:
            f.write(subprocess.run(["ps", "-L", "-o", "pid,ppid,tid,stat,wchan:32,comm", "-s", str(pid)],
                                   capture_output=True, text=True).stdout)
        except OSError as e:  # no ps on this machine
            f.write(f"ps: {e}\n")
        f.write("\n--- native stacks ---\n")
        save_stacks(pid, f)
    time.sleep(2)  # faulthandler's Python stacks reach the child's stderr
    return path


if __name__ == "__main__":
    main()
