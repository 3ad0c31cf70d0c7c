"""What tools/dev/loader_stage_probe.py records in the loader's process: CPU time per thread and per
worker, the decoding thread's waits for the workers, its waits in the decoder and the Python between
two decodes, each step's CPU time, each worker's own times. Each record_* wraps the loader's
functions where its threads look them up; the lists fill while MARKS["timing"] is set (the probe's
timed window)."""
import os
import threading
import time

from benchmark_pipeline import proc_stat


def proc_cpu_seconds(pid, task=None):
    """User + system CPU seconds of process `pid` (or of its thread `task`)."""
    _, (utime, stime, _, _) = proc_stat(f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat")
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


class CpuClock:
    """CPU seconds of each Python thread (by name), of the whole process and of the worker processes."""

    def __init__(self, worker_pids=()):
        self.worker_pids = list(worker_pids)

    def read(self):
        out = {"process": time.process_time(), "workers": sum(proc_cpu_seconds(p) for p in self.worker_pids)}
        for t in threading.enumerate():
            try:  # (pthread_getcpuclockid of another thread read nonsense on the GPU machine)
                out["py:" + t.name] = proc_cpu_seconds(os.getpid(), t.native_id)
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


WAITS = []  # (seconds the decoding thread waited for the batch, its worker) per batch, timed window
READY = []  # batches already received when the decoding thread came for its next one
FRESH = {}  # worker -> batches whose slot's tensor travelled with them (new, grown or reclaimed)
ARRIVALS = []  # (seconds the receiving thread waited for the DataLoader's next batch, its worker)
WORKER_TIMES = []  # each batch's worker_times record (--per-worker), timed window


def record_worker_times():
    """Each batch's worker records its own times (worker_times.py); they are kept as batches arrive."""
    import orbbec.data._stream as stream
    from worker_times import KEY, install

    install()
    start_workers = stream.start_workers

    def collected(reader):
        def arrived(_, batch):
            if MARKS.get("timing") and KEY in getattr(batch, "extra", {}):
                WORKER_TIMES.append(batch.extra[KEY])
        return _observed(start_workers(reader), after=arrived)
    stream.start_workers = collected


def _observed(source, before=None, after=None):
    """The items of iterator `source`; before() runs as each is asked for, after(seconds waited for
    it, item) once it came."""
    while True:
        if before:
            before()
        t = time.perf_counter()
        try:
            item = next(source)
        except StopIteration:
            return
        if after:
            after(time.perf_counter() - t, item)
        yield item


def record_waits():
    """Records each batch's wait for the workers (loader.timing() gives only the mean), so that a
    steady lag is told from rare long stalls, and a slow worker from all of them; with it how full
    the received queue was when the decoding thread came for a batch (empty: the receiving side is
    the limit; full: a stall is the decoder's own), the slots whose tensor travelled with their batch
    (a fresh shared-memory file: torch's handshake with the worker, then page-locking here), and the
    receiving thread's wait for each batch."""
    import orbbec.data._shared as shared
    import orbbec.data._stream as stream

    finish, items, attach = stream.GpuStream._finish, stream.GpuStream._items, shared.SlotTable.attach
    start_workers = stream.start_workers

    def wrapped(self, batch, started, waited):
        if MARKS.get("timing"):
            WAITS.append((waited, None if batch.slot is None else batch.slot[0]))
        return finish(self, batch, started, waited)

    def counted_items(self, q):
        def ready():
            if q is self.received and MARKS.get("timing"):
                READY.append(q.qsize())
        return _observed(items(self, q), before=ready)

    def counted_attach(self, worker, slot, tensor):
        if tensor is not None and MARKS.get("timing"):
            FRESH[worker] = FRESH.get(worker, 0) + 1
        return attach(self, worker, slot, tensor)

    def timed_workers(reader):
        def arrived(waited, batch):
            if MARKS.get("timing"):
                ARRIVALS.append((waited, None if batch.slot is None else batch.slot[0]))
        return _observed(start_workers(reader), after=arrived)
    stream.GpuStream._finish = wrapped
    stream.GpuStream._items = counted_items
    shared.SlotTable.attach = counted_attach
    stream.start_workers = timed_workers


GAPS = {"wait": [], "between": [], "gil": []}  # seconds per batch (see --gaps)


def record_gaps():
    """Times each StartedDecode's result() and the Python from it to the next decode's start."""
    import orbbec.io as io

    init, result = io.StartedDecode.__init__, io.StartedDecode.result
    last = {}

    def timed_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if "result_end" in last:
            GAPS["between"].append(time.perf_counter() - last.pop("result_end"))

    def timed_result(self):
        t = time.perf_counter()
        out = result(self)
        last["result_end"] = time.perf_counter()
        GAPS["wait"].append(last["result_end"] - t)
        GAPS["gil"].append(getattr(io.last_call, "gil_s", 0.0))
        return out
    io.StartedDecode.__init__, io.StartedDecode.result = timed_init, timed_result


def gap_summary():
    import numpy as np

    def spread(name):
        v = np.array(GAPS[name][len(GAPS[name]) // 5:]) * 1e3  # the first fifth is the warm-up's
        if not len(v):
            return f"{name}: none"
        return (f"{name} ms p10 {np.percentile(v, 10):.3f} p50 {np.median(v):.3f} p90 {np.percentile(v, 90):.3f} "
                f"p99 {np.percentile(v, 99):.3f} max {v.max():.2f} mean {v.mean():.3f} (n {len(v)})")
    return "\n    ".join(spread(k) for k in ("wait", "between", "gil"))


LONG_MS = 5.0  # a wait this long or longer is a stall


def _long_by_worker(pairs):
    """(waits in ms, which of them are long, the long ones counted by worker) of (seconds, worker) pairs."""
    import numpy as np

    w = np.array([x for x, _ in pairs]) * 1e3
    long = w > LONG_MS
    by_worker = {}
    for (_, k), is_long in zip(pairs, long):
        if is_long:
            by_worker[k] = by_worker.get(k, 0) + 1
    return w, long, dict(sorted(by_worker.items(), key=str))


def wait_summary():
    import numpy as np

    if not WAITS:
        return "no batches"
    w, long, by_worker = _long_by_worker(WAITS)
    ready = np.bincount(np.array(READY, dtype=np.int64)).tolist() if READY else []
    a, _, a_by_worker = _long_by_worker(ARRIVALS) if ARRIVALS else (np.zeros(1), None, {})
    return (f"waits for the workers over {len(w)} batches (ms): mean {w.mean():.2f}, p50 {np.median(w):.3f}, "
            f"p90 {np.percentile(w, 90):.2f}, p99 {np.percentile(w, 99):.2f}, max {w.max():.1f}; "
            f"waits over {LONG_MS:g} ms: {long.sum()}, {w[long].sum() / max(w.sum(), 1e-9):.0%} of the time waited; "
            f"by worker (slot's; None: no slot): {by_worker}\n"
            f"    batches ready when the decoding thread came (count by queue length): {ready}\n"
            f"    receiving thread's wait for the DataLoader's next batch (ms): mean {a.mean():.2f}, "
            f"p99 {np.percentile(a, 99):.2f}, max {a.max():.1f}, over {LONG_MS:g} ms by worker {a_by_worker}\n"
            f"    slots whose tensor travelled with the batch, by worker: {dict(sorted(FRESH.items()))}")


STEPS = {}  # step name -> (CPU seconds, calls) since the clock started
MARKS = {}  # batches taken since the clock started ("n"), and the CPU clock's first reading


def _timed(name, f):
    def wrapped(*args, **kwargs):
        t = time.thread_time()
        try:
            return f(*args, **kwargs)
        finally:
            cpu, calls = STEPS.get(name, (0.0, 0))
            STEPS[name] = (cpu + time.thread_time() - t, calls + 1)
    return wrapped


def wrap_steps():
    """Wraps the loader's steps where its threads look them up."""
    import torch.utils.data.dataloader as dl

    import orbbec.augment as A
    import orbbec.data._samples as samples
    import orbbec.data._stages as stages
    import orbbec.data._stream as stream
    import orbbec.io as io
    import orbbec.warpaffine as W

    for mod, names in ((stream, ("augment_batch", "_pin_and_move", "start_decode_batch", "finish_decode")),
                       (stages, ("start_batch_decode",)), (io, ("_finish_cuda",)), (W, ("warp_affine",))):
        for n in names:
            setattr(mod, n, _timed(f"{mod.__name__.split('.')[-1]}.{n}", getattr(mod, n)))
    for cls, names in ((A.Compose, ("apply",)), (samples.HostBatch, ("unpack", "buffers")),
                       (io.StartedDecode, ("result", "__init__")), (stream.GpuStream, ("_release", "_put", "next_batch")),
                       (dl._MultiProcessingDataLoaderIter, ("__next__",))):
        for n in names:
            setattr(cls, n, _timed(f"{cls.__name__}.{n}", getattr(cls, n)))
