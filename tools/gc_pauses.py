"""Python's cyclic garbage collections over a stretch of a run, timed (gc.callbacks). A collection
holds the GIL from start to end, so while a full one (generation 2) scans a large heap (a dataset
of Python objects, the model's modules) no other Python thread runs: the training loop launches no
kernel and the loader's threads start no decode.

    with Collections() as gcs:
        ...                      # the timed work
    print(gcs.summary())         # or gcs.summary(t0, t1): those that ended between two perf_counter()s
"""
import gc
import threading
import time


class Collections:
    def __init__(self):
        self.records = []  # (perf_counter at the end, generation, seconds, the thread that triggered it)
        self._began = None

    def start(self):
        gc.callbacks.append(self._timed)
        return self

    def stop(self):
        if self._timed in gc.callbacks:
            gc.callbacks.remove(self._timed)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _timed(self, phase, info):
        now = time.perf_counter()
        if phase == "start":
            self._began = now
        elif self._began is not None:
            self.records.append((now, info["generation"], now - self._began, threading.current_thread().name))
            self._began = None

    def summary(self, t0=float("-inf"), t1=float("inf")) -> str:
        """Collections that ended between t0 and t1, by generation (count, time in all, the longest),
        and the threads that triggered the full ones."""
        parts = []
        for g in (0, 1, 2):
            d = [s for t, gen, s, _ in self.records if gen == g and t0 <= t <= t1]
            parts.append(f"gen {g}: {len(d)}" + (f" ({sum(d) * 1e3:.1f} ms, longest {max(d) * 1e3:.1f})" if d else ""))
        full = sorted({name for t, gen, _, name in self.records if gen == 2 and t0 <= t <= t1})
        return "garbage collections " + ", ".join(parts) + (f"; full ones from {', '.join(full)}" if full else "")
