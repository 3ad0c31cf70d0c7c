"""Each loader worker's own time per batch, carried with the batch to the loader's process: the
worker thread's CPU time (and the kernel's share of it, system calls and page faults: getrusage's
split, sampled at the scheduler's tick, so coarser than the CPU time) and wall time, its minor page
faults, its involuntary context switches (the kernel took the core away: the worker waited for one)
and voluntary ones, and the cores it started and ended on. It tells a late worker that does more
work from one that waits for a core (loader_stage_probe.py --per-worker). On the GPU machine (a
virtual machine) the time the GPU's interrupts took showed up as the interrupted worker's user time:
the core tells (tools/dev/core_interrupts.py).

install() must run before the loader's workers start (they inherit the wrapped __getitem__).
"""
from __future__ import annotations

import resource
import time
from collections import Counter

KEY = "worker_times"


def _core() -> int:
    """The core this thread runs on (/proc's `processor` field; the name in field 2 may hold spaces)."""
    with open("/proc/thread-self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def install() -> None:
    """Wraps the loader's batch dataset so that each batch records its worker's times."""
    import torch
    import orbbec.data._loader as loader

    get = loader._Batches.__getitem__
    if getattr(get, "_times_recorded", False):
        return

    def timed(self, key):
        info = torch.utils.data.get_worker_info()
        u0, c0, t0, core0 = resource.getrusage(resource.RUSAGE_THREAD), time.thread_time(), time.perf_counter(), _core()
        batch = get(self, key)
        u1 = resource.getrusage(resource.RUSAGE_THREAD)
        batch.extra[KEY] = (None if info is None else info.id, time.thread_time() - c0, time.perf_counter() - t0,
                            u1.ru_nivcsw - u0.ru_nivcsw, u1.ru_nvcsw - u0.ru_nvcsw, (core0, _core()),
                            u1.ru_stime - u0.ru_stime, u1.ru_minflt - u0.ru_minflt)
        return batch
    timed._times_recorded = True
    loader._Batches.__getitem__ = timed


def summary(records) -> dict:
    """{worker: figures} over `records` (each batch's recorded tuple): batches, CPU, its system part,
    and wall ms per batch (mean; wall's max), the share of wall time off the CPU, context switches and
    minor page faults per batch, the batches that ended on another core than they started on, and the
    core most batches ended on."""
    by_worker = {}
    for worker, cpu, wall, inv, vol, (c0, c1), system, faults in records:
        by_worker.setdefault(worker, []).append((cpu, wall, inv, vol, c0 != c1, system, faults, c1))
    out = {}
    for worker, rows in sorted(by_worker.items(), key=lambda kv: str(kv[0])):
        n = len(rows)
        cpu = sum(r[0] for r in rows)
        wall = sum(r[1] for r in rows)
        out[worker] = {"batches": n, "cpu_ms": round(cpu / n * 1e3, 2), "wall_ms": round(wall / n * 1e3, 2),
                       "wall_max_ms": round(max(r[1] for r in rows) * 1e3, 1),
                       "off_cpu": round(1 - cpu / wall, 2) if wall > 0 else 0.0,
                       "involuntary": round(sum(r[2] for r in rows) / n, 1),
                       "voluntary": round(sum(r[3] for r in rows) / n, 1),
                       "moved": sum(r[4] for r in rows),
                       "system_ms": round(sum(r[5] for r in rows) / n * 1e3, 2),
                       "faults": round(sum(r[6] for r in rows) / n, 1),
                       "core": Counter(r[7] for r in rows).most_common(1)[0][0]}
    return out


def format_summary(records) -> str:
    lines = ["per worker: batches, CPU (system part) / wall ms per batch (wall max), off-CPU share, "
             "context switches per batch (involuntary / voluntary), minor faults per batch, "
             "batches moved between cores, usual core"]
    for worker, s in summary(records).items():
        lines.append(f"      worker {worker}: {s['batches']}, {s['cpu_ms']} ({s['system_ms']}) / {s['wall_ms']} ms "
                     f"({s['wall_max_ms']}), {s['off_cpu']:.0%} off, {s['involuntary']} / {s['voluntary']}, "
                     f"{s['faults']} faults, {s['moved']} moved, core {s['core']}")
    return "\n".join(lines)
