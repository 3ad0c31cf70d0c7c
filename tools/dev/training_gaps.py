"""Where the training step's extra time goes beside orbbec's loader: torch.profiler traces of a few
ResNet-50 steps (AMP, batch 256) fed by synthetic data and by GPULoader; per step the training
stream's kernel time, the sum of its gaps and the largest of them, and the other streams' kernels.

    OUT=/tmp [MODES=synthetic,orbbec] [SI=switch interval s] [PW=workers] python tools/dev/training_gaps.py

Writes the traces (trace_<mode>.json.gz) under $OUT."""
import json, os, sys, time
import numpy as np
import torch
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..")); sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import profile_loader as pl
import orbbec.augment as A
from orbbec.data import GPULoader
from torch.profiler import profile, ProfilerActivity

out_dir = os.environ.get("OUT", "/tmp")
workers = int(os.environ.get("PW", "6"))
items = pl.items_of(None, 256)
transform = A.Compose([A.RandomResizedCrop(224), A.RandomHorizontalFlip(), A.Normalize(A.IMAGENET_MEAN, A.IMAGENET_STD)])
dev = torch.device("cuda")
train = pl.training_step("resnet50", dev, fused=os.environ.get("FUSED") == "1")

def synthetic():
    return pl.synthetic_batches(256, dev)

def orbbec():
    ld = GPULoader(items, 256, transform=transform, shuffle=True, drop_last=True, num_workers=workers, prefetch=3)
    while True:
        for x, y in ld:
            yield x, y.to(dev, non_blocking=True)

NEXT = []
def step(it):
    t = time.perf_counter()
    x, y = next(it)
    NEXT.append(time.perf_counter() - t)
    train(x, y)

if os.environ.get("SI"):
    sys.setswitchinterval(float(os.environ["SI"]))
srcs = {"synthetic": synthetic, "orbbec": orbbec}
for name in os.environ.get("MODES", "synthetic,orbbec").split(","):
    src = srcs[name]
    it = src()
    for _ in range(15):
        step(it)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    NEXT.clear()
    for _ in range(30):
        step(it)
    torch.cuda.synchronize()
    rate = 30 * 256 / (time.perf_counter() - t0)
    print(f"   next(it) host ms per step: mean {np.mean(NEXT)*1e3:.2f} max {np.max(NEXT)*1e3:.2f}")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(6):
            with torch.profiler.record_function("STEP"):
                step(it)
        torch.cuda.synchronize()
    path = f"{out_dir}/trace_{name}.json"
    prof.export_chrome_trace(path)
    tr = json.load(open(path))["traceEvents"]
    kern = [e for e in tr if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    steps = sorted([e for e in tr if e.get("name") == "STEP" and e.get("cat") == "user_annotation"], key=lambda e: e["ts"])
    streams = {}
    for e in kern:
        streams.setdefault(e["args"].get("stream"), []).append(e)
    main_stream = max(streams, key=lambda s: sum(e["dur"] for e in streams[s]))
    mk = sorted(streams[main_stream], key=lambda e: e["ts"])
    first, last = mk[0]["ts"], mk[-1]["ts"] + mk[-1]["dur"]
    busy = sum(e["dur"] for e in mk)
    gaps = [(mk[i + 1]["ts"] - (mk[i]["ts"] + mk[i]["dur"]), mk[i]["name"][:50], mk[i + 1]["name"][:50]) for i in range(len(mk) - 1)]
    big = sorted(gaps, reverse=True)[:8]
    other = {s: (len(v), sum(e["dur"] for e in v) / 1e3) for s, v in streams.items() if s != main_stream}
    print(f"== {name}: {rate:,.0f} img/s (30 steps, unprofiled); profiled 6 steps: main stream {main_stream} span "
          f"{(last-first)/6e3:.1f} ms/step, kernel busy {busy/6e3:.1f} ms/step, gaps>50us sum "
          f"{sum(g for g,_,_ in gaps if g > 50)/6e3:.2f} ms/step")
    for g, a, b in big:
        print(f"   gap {g/1e3:6.2f} ms after {a} -> {b}")
    print("   other streams (kernels, ms total over 6 steps):", other)
    # the slowest kernels vs synthetic: by name, total
    tot = {}
    for e in mk:
        tot[e["name"][:60]] = tot.get(e["name"][:60], 0) + e["dur"]
    json.dump(tot, open(f"{out_dir}/kern_{name}.json", "w"))
    os.system(f"gzip -f {path}")
