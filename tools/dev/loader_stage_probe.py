"""Where the loader loses against decoding alone: GPULoader with the workload's transform, the same
loader with no transform (decoded images handed out as they are), and the decoder alone driven as the
loader drives it; images/s and loader.timing() (ms per batch). One measurement per process (a loader's
workers outlive it for a while), so alternate from the shell:

    for r in 1 2; do for m in transform none decode; do
      python tools/dev/loader_stage_probe.py --workload cls-500x375 --mode $m; done; done

--steps: the CPU time (time.thread_time, so the thread's own, not waiting for the GIL) of the loader
threads' steps per batch, inclusive (nested steps count in their callers too). cProfile cannot do
this on Python 3.12: it sees every thread's calls.
--waits: the spread of the decoding thread's waits for the workers' batches (percentiles, long stalls,
which worker).
--per-worker: each worker's own CPU and wall time per batch, its context switches and cores
(tools/dev/worker_times.py), to tell a late worker that does more work from one that waits for a core.
--cpu: CPU time per batch of each Python thread of the loader's process (a Python thread's CPU time
is about the time it held the GIL: torch's host calls keep it), of the native threads (the decoder's
pool) and of the workers; Python threads summing to about the wall time per batch mean the GIL bounds
the loader.
--gaps: per batch, how long the decoding thread waited in each result() (short: the batch was done
before it was asked for) and how long its Python took from one result() to the start after it
(the decoder then has one batch fewer queued), with the GIL's share of taking it back (the decoder's
own gil_s); both modes, so that the loader's thread is set beside the decoding-alone loop's.
--switch-interval S: sys.setswitchinterval(S) in this process (Python's default 0.005 s is how long a
thread that wants the GIL may wait for a busy holder).
--busy N --duty D: N processes beside it, each spinning in Python a fraction D of every 20 ms (random
phases): with --mode decode, whether decoding alone slows down under the CPU load of the loader's
workers (24 workers at about 7.5 ms of CPU per batch of 128, every 24th batch: --busy 24 --duty 0.1).
--worker-load R: beside it, in another process, --workers real GPU-loader workers making R batches a
second with nothing decoding them (tools/dev/worker_batch_time.py --rate): with --mode decode, whether
the workers' load on the host alone (not the loader's Python in this process) slows decoding alone.
--copy-load R: beside it, --workers processes copying the workload's batches of JPEG bytes into
slots, R batches a second in all, and nothing else (tools/dev/copy_load.py): the workers' memory
traffic without their Python, to set beside --worker-load and --busy.
--cuda-schedule S: the CUDA context's scheduling flag (see cuda_schedule).
--engine-use: how busy NVML saw the JPEG engines and the SMs over the measured window
(tools/dev/engine_use.py): engines near fully busy decoding alone make them the ceiling, and a loader
that keeps them less busy leaves them waiting.
--gc: every cyclic garbage collection of this process over the measured window, by generation, with
its time (a full one holds the GIL for tens of milliseconds: no decode is started meanwhile).
--gc-freeze: gc.collect() then gc.freeze() once the data is built, before CUDA and the loader start,
as a user may after setup: full collections then scan only what came later (whether the loader's
rate follows the collections' cost)."""
import argparse
import gc
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import orbbec  # noqa: E402,F401  (before CUDA starts: orbbec/common/cuda_connections.py)
from benchmark_pipeline import (build_data, decode_ahead, forever, machine_jiffies, machine_share, measure,  # noqa: E402
                                orbbec_transform, rows_to_decode_of, run_decode_only)
import copy_load  # noqa: E402
from engine_use import EngineUse  # noqa: E402
from loader_records import (ARRIVALS, FRESH, MARKS, READY, STEPS, WAITS, WORKER_TIMES, CpuClock,  # noqa: E402
                            gap_summary, record_gaps, record_waits, record_worker_times, wait_summary, wrap_steps)
from gc_pauses import Collections  # noqa: E402


def split_cores(worker_pids, n_worker_cores):
    """The workers' threads on the first `n_worker_cores` cores this process may use, this process's
    threads (the loader's and the decoder's) on the others."""
    cores = sorted(os.sched_getaffinity(0))
    mine, theirs = set(cores[n_worker_cores:]), set(cores[:n_worker_cores])
    for pid, allowed in [(os.getpid(), mine)] + [(p, theirs) for p in worker_pids]:
        threads_on(pid, allowed)


def threads_on(pid, allowed, skip=()) -> int:
    """The threads of process `pid` (less those in `skip`) allowed only the cores `allowed`; how many."""
    moved = 0
    for tid in map(int, os.listdir(f"/proc/{pid}/task")):
        if tid in skip:
            continue
        try:
            os.sched_setaffinity(tid, allowed)
            moved += 1
        except OSError:  # a thread that has just ended
            pass
    return moved


def interrupt_core():
    """The core that has taken the most of the GPU driver's interrupts ("nvidia" lines of
    /proc/interrupts, counted since boot), or None."""
    from core_interrupts import interrupt_counts

    with open("/proc/interrupts") as f:
        counts = [c for name, c in interrupt_counts(f.read()).items() if "nvidia" in name]
    if not counts:
        return None
    per_core = [sum(c[i] for c in counts if i < len(c)) for i in range(max(len(c) for c in counts))]
    return max(range(len(per_core)), key=per_core.__getitem__)


def native_threads_off(core):
    """This process's threads that are not Python's (the decoder's lanes and pool, CUDA's) kept off
    `core`; the workers and the loader's Python threads may still run there. Returns how many moved."""
    python = {t.native_id for t in threading.enumerate()}
    return threads_on(os.getpid(), set(os.sched_getaffinity(0)) - {core}, skip=python)


def cut_items(workload, items):
    """The items with each JPEG cut to the rows one draw of its warp reads (the loader's
    partial_decode, decided once per file), for decoding alone on those rows."""
    import numpy as np
    from orbbec.io._buffers import with_height

    out = []
    for it, frame, rows in zip(items, *rows_to_decode_of(items, list(range(len(items))), workload)):
        image = it["image"]
        if rows is not None:
            image = np.frombuffer(image, np.uint8).copy()
            with_height(image, frame, rows)
            image = image.tobytes()
        out.append(dict(it, image=image))
    return out


def run_decode_packed(items, batch, seconds, pinned):
    """Decoding alone from each batch packed in one buffer, as the loader's workers pack it, page-locked
    (as the loader's slots are) or pageable; driven one batch ahead, as run_decode_only drives it."""
    import torch
    from orbbec.io import PackedImages
    from workloads import full_batches, pack_jpegs

    packed = []
    for files in full_batches([it["image"] for it in items], batch):
        flat, offsets = pack_jpegs(files)
        t = torch.from_numpy(flat)
        packed.append(PackedImages((t.pin_memory() if pinned else t).numpy(), offsets))
    return decode_ahead(packed, seconds)


def _busy(duty, stop, seed):
    """A busy process: spins for `duty` of every 20 ms (a random phase, sleeps jittered)."""
    import random

    period, rnd = 0.020, random.Random(seed)
    time.sleep(rnd.random() * period)
    x = 0
    while not stop.is_set():
        t = time.perf_counter()
        while time.perf_counter() - t < duty * period:
            for _ in range(200):
                x += 1
        if duty < 1:
            time.sleep((1 - duty) * period * (0.5 + rnd.random()))


def start_busy(count, duty, cores=0):
    """count processes keeping cores busy (forked before CUDA starts here); returns their stop event.
    cores > 0: they run on the first `cores` cores and this process (its threads to come) on the rest."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    stop = ctx.Event()
    procs = [ctx.Process(target=_busy, args=(duty, stop, k), daemon=True) for k in range(count)]
    for p in procs:
        p.start()
    if cores:  # (threads started here later inherit their creator's cores)
        split_cores([p.pid for p in procs], cores)
    return stop


# CUDA's primary-context scheduling flags (how a thread waits for the GPU in a synchronising call).
SCHEDULES = {"auto": 0, "spin": 1, "yield": 2, "blocking": 4}


def cuda_schedule(name):
    """Sets device 0's primary context flags before CUDA starts: --cuda-schedule. With "auto" (the
    default) and fewer contexts than cores the driver spins in waits, nvJPEG's own inside
    nvjpegDecodeBatched among them; "blocking" sleeps instead. Returns the flags read back."""
    import ctypes

    cu = ctypes.CDLL("libcuda.so.1")
    dev, flags, active = ctypes.c_int(0), ctypes.c_uint(0), ctypes.c_int(0)
    for call in (lambda: cu.cuInit(0), lambda: cu.cuDeviceGet(ctypes.byref(dev), 0),
                 lambda: cu.cuDevicePrimaryCtxSetFlags_v2(dev, SCHEDULES[name]),
                 lambda: cu.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active))):
        r = call()
        if r != 0:
            raise RuntimeError(f"--cuda-schedule: a CUDA driver call failed ({r})")
    return f"flags {flags.value:#x}, context active {active.value}"


def host_ms_per_call(before):
    """The decoder's host time per call (ms) since the decoder_stats() reading `before`, by phase."""
    from orbbec.io import decoder_stats

    now = decoder_stats()
    ha, hb = before["host_seconds"], now["host_seconds"]
    calls = max(hb["calls"] - ha["calls"], 1)
    out = {k: round((hb[k] - ha[k]) / calls * 1e3, 2) for k in hb if k != "calls"}
    # The decoder's running estimate of the engine's pace (CUDA events around its batches). Not a
    # throughput: consecutive calls overlap in the engine (docs/dev/decode.md, "Det's gap taken apart").
    out["engine Mpx/s"] = round(now["hardware_pixels_per_s"] / 1e6)
    return out


def start_worker_load(workload, workers, rate):
    """worker_batch_time.py's workers at `rate` batches/s in a child process of its own session, once
    they run at that pace. Its output goes to a file: its workers outlive it for a while and would hold
    a pipe open (subprocess then waits for them)."""
    tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_batch_time.py")
    out = tempfile.mkstemp(prefix="worker_load_", suffix=".log")[1]
    with open(out, "w") as f:  # (the child's own file offset; this process reads the file by its name)
        proc = subprocess.Popen([sys.executable, "-W", "ignore", tool, "--workload", workload, "--workers",
                                 str(workers), "--rate", str(rate), "--batches", str(10**7)], stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)
    t = time.monotonic()
    while not _output(out).startswith("started"):
        if proc.poll() is not None or time.monotonic() - t > 120:
            stop_worker_load(proc, out)
            raise RuntimeError(f"worker load did not start: {_output(out)!r}")
        time.sleep(0.2)
    return proc, out


def stop_worker_load(proc, out) -> str:
    """Stops the child and its workers; its last line (the workers' CPU per batch)."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    lines = _output(out).strip().splitlines()
    os.unlink(out)
    return lines[-1] if lines else "(no output)"


def _output(path) -> str:
    with open(path) as f:
        return f.read()


def run_loader(items, batch, seconds, workers, transform, cpu=False, worker_cores=0, windows=1, native_off_irq=False):
    from orbbec.data import GPULoader

    loader = GPULoader(items, batch, transform=transform, shuffle=True, num_workers=workers, prefetch=4,
                       drop_last=True, seed=0)
    it = forever(lambda: iter(loader))

    def step():
        images = next(it)["image"]
        MARKS["n"] = MARKS.get("n", 0) + 1
        return len(images)

    def start():
        loader.timing(reset=True)
        STEPS.clear()
        WAITS.clear()
        READY.clear()
        ARRIVALS.clear()
        FRESH.clear()
        WORKER_TIMES.clear()
        MARKS["timing"] = True
        MARKS["n"] = 0
        pids = [w.pid for w in getattr(loader._reader._iterator, "_workers", [])]
        if worker_cores:
            split_cores(pids, worker_cores)
        if native_off_irq:
            core = interrupt_core()
            if core is not None:
                print(f"  interrupt core {core}: {native_threads_off(core)} native threads kept off it", flush=True)
        if cpu:
            MARKS["clock"] = CpuClock(pids)
            MARKS["a"], MARKS["t"] = MARKS["clock"].read(), time.perf_counter()
    from orbbec.io import decoder_stats

    # With windows > 1, the windows back to back without a timed warm-up (the first includes the
    # loader's start; the last follows 4 batches), so that a process's first seconds are told from its
    # steady state.
    for k in range(1, windows + 1):
        s0 = decoder_stats()
        last = k == windows
        rate, _ = measure(step, seconds, warmup=4 if last else 0, warmup_s=None if windows == 1 else 0,
                          on_start=start if last else None)
        if windows > 1:
            print(f"  window {k}: {rate:8,.0f} img/s  decoder host ms per call {host_ms_per_call(s0)}", flush=True)
    t = loader.timing()
    out = {k: round(v * 1e3, 2) for k, v in t.items() if k != "batches"}
    out["decoder host ms per call (warm-up included)"] = host_ms_per_call(s0)  # as --mode decode gives it
    if cpu:
        b = MARKS["clock"].read()
        out["cpu ms/batch"] = CpuClock.per_batch(MARKS["a"], b, MARKS["n"], time.perf_counter() - MARKS["t"])
    return rate, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="cls-500x375")
    ap.add_argument("--mode", choices=("transform", "none", "decode"), default="transform")
    ap.add_argument("--seconds", type=float, default=2.5)
    ap.add_argument("--workers", type=int, default=9)
    ap.add_argument("--steps", action="store_true")
    ap.add_argument("--waits", action="store_true", help="how each batch's wait for the workers is spread")
    ap.add_argument("--no-fuse", action="store_true", help="warp in the augmenting thread, not the decoder's")
    ap.add_argument("--in-flight", type=int, default=0, help="the decoding thread's batches in flight (default: the loader's)")
    ap.add_argument("--received-depth", type=int, default=0,
                    help="room for received batches before the decoding thread (default: the loader's)")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--native-off-irq", action="store_true",
                    help="keep the decoder's native threads off the core that takes the GPU's interrupts")
    ap.add_argument("--per-worker", action="store_true", help="each worker's own times per batch (worker_times.py)")
    ap.add_argument("--windows", type=int, default=1, help="measure this many windows in turn in one process")
    ap.add_argument("--cut-rows", action="store_true", help="--mode decode: on the rows a draw's warp reads only")
    ap.add_argument("--packed", choices=("pageable", "pinned"), default=None,
                    help="--mode decode: each batch packed in one buffer as the loader's workers pack it")
    ap.add_argument("--worker-cores", type=int, default=0,
                    help="after the warm-up, the workers on this many cores and this process on the rest")
    ap.add_argument("--per-sample-draws", action="store_true",
                    help="the workers draw sample by sample (orbbec.augment's loop), not batch-wide")
    ap.add_argument("--busy", type=int, default=0, help="processes keeping cores busy beside it (see --duty)")
    ap.add_argument("--duty", type=float, default=1.0, help="--busy: each one's busy share of every 20 ms")
    ap.add_argument("--busy-cores", type=int, default=0,
                    help="--busy: those processes on this many cores, this process on the others")
    ap.add_argument("--gaps", action="store_true", help="the decoding thread's waits and Python per batch")
    ap.add_argument("--switch-interval", type=float, default=0.0, help="sys.setswitchinterval (seconds)")
    ap.add_argument("--worker-load", type=float, default=0.0, help="batches/s of workers beside it (see above)")
    ap.add_argument("--copy-load", type=float, default=0.0, help="batches/s of copies beside it (see above)")
    ap.add_argument("--cuda-schedule", choices=tuple(SCHEDULES), default=None,
                    help="the primary context's scheduling flag, set before CUDA starts (see cuda_schedule)")
    ap.add_argument("--engine-use", action="store_true", help="the JPEG engines' and SMs' busy share (see above)")
    ap.add_argument("--gc", action="store_true", help="this process's garbage collections (see above)")
    ap.add_argument("--gc-freeze", action="store_true", help="freeze the heap once the data is built (see above)")
    a = ap.parse_args()
    if a.cuda_schedule:
        print(f"  CUDA schedule: {cuda_schedule(a.cuda_schedule)}", flush=True)
    load = start_worker_load(a.workload, a.workers, a.worker_load) if a.worker_load else None
    if a.switch_interval:
        sys.setswitchinterval(a.switch_interval)
    if a.gaps:
        record_gaps()
    gcs = Collections().start() if a.gc else None
    stop = start_busy(a.busy, a.duty, a.busy_cores) if a.busy else None
    j0 = machine_jiffies()
    if a.per_sample_draws:
        import orbbec.augment as augment
        augment.BATCH_DRAW_MIN = 10**9  # (the workers fork later and keep it)
    if a.steps:
        wrap_steps()
    if a.waits:
        record_waits()
    if a.per_worker:
        record_worker_times()
    if a.no_fuse:
        import orbbec.data._stages as stages
        stages._warp_in_decoder = lambda *args: None
    if a.in_flight:
        import orbbec.data._loader as loader_module
        import orbbec.data._stream as stream
        stream.DECODES_IN_FLIGHT = loader_module.DECODES_IN_FLIGHT = a.in_flight  # (the slots follow it)
    if a.received_depth:
        import orbbec.data._loader as loader_module
        import orbbec.data._stream as stream
        stream.RECEIVED_DEPTH = loader_module.RECEIVED_DEPTH = a.received_depth  # (the slots follow it)
    items, batch = build_data(a.workload)
    use = EngineUse() if a.engine_use else None
    copies = None
    if a.copy_load:  # the workload's own JPEGs, copied as its workers would (before CUDA starts)
        import numpy as np
        src = [np.frombuffer(it["image"], np.uint8) for it in items]  # (views of the dataset's bytes)
        copies = copy_load.start(a.copy_load, a.workers, src, batch) + (time.perf_counter(),)
    if a.cut_rows:
        items = cut_items(a.workload, items)
    if a.gc_freeze:
        gc.collect()
        gc.freeze()
    if a.mode == "decode":
        from orbbec.io import decoder_stats

        s0 = decoder_stats()  # (creates the decoder)
        if a.packed:
            r = run_decode_packed(items, batch, a.seconds, a.packed == "pinned")[0]
        else:
            r = run_decode_only(a.workload, items, batch, a.seconds, a.workers)[0]
        t = f"decoder host ms per call (warm-up included) {host_ms_per_call(s0)}"
    else:
        tf = orbbec_transform(a.workload) if a.mode == "transform" else None
        r, t = run_loader(items, batch, a.seconds, a.workers, tf, cpu=a.cpu, worker_cores=a.worker_cores,
                          windows=a.windows, native_off_irq=a.native_off_irq)
    t_end = time.perf_counter()  # the measured window is the last a.seconds before this
    if stop is not None:
        stop.set()
    if load is not None:
        print("    worker load beside: " + stop_worker_load(*load), flush=True)
    if copies is not None:
        copies[0].set()
        rate = copies[1].value / (time.perf_counter() - copies[2])
        print(f"    copy load beside: {rate:.0f} batches/s", flush=True)
    busy = f" busy {a.busy}x{a.duty:g}" + (f" on {a.busy_cores} cores" if a.busy_cores else "") if a.busy else ""
    life = machine_share(j0, machine_jiffies())
    print(f"{a.workload:12s} {a.mode:9s}{busy} {r:8,.0f} img/s  (process life: machine {life['machine_cores_busy']:.1f} "
          f"of {os.cpu_count()} cores busy, steal {life['steal']:.1%})  {t}", flush=True)
    if use is not None:
        print("    " + use.summary(t_end - a.seconds, t_end), flush=True)
    if gcs is not None:
        print(f"    {gcs.summary(t_end - a.seconds, t_end)}; {len(gc.get_objects())} objects tracked", flush=True)
    if a.waits:
        print("    " + wait_summary(), flush=True)
    if a.gaps:
        print("    " + gap_summary(), flush=True)
    if a.per_worker:
        from worker_times import format_summary
        print("    " + format_summary(WORKER_TIMES), flush=True)
    if a.steps:
        n = max(MARKS.get("n", 1), 1)
        for name, (cpu, calls) in sorted(STEPS.items(), key=lambda kv: -kv[1][0]):
            print(f"    {name:40s} {cpu / n * 1e3:7.3f} ms CPU per batch  ({calls / n:.1f} calls)")


if __name__ == "__main__":
    main()
