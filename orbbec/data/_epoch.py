"""One epoch's iteration: the batches served, counted for state_dict, and on the GPU path each
batch's key checked against the one the epoch expects; the loader's timing record."""
from __future__ import annotations

import threading
from typing import Optional

from ._keys import Plan
from ._samples import HostBatch


class Timing:
    NAMES = ("workers", "decode", "decode_native", "decode_gil", "augment_wait", "augment", "consumer")

    def __init__(self):
        self.batches, self.totals = 0, dict.fromkeys(self.NAMES, 0.0)
        self.lock = threading.Lock()  # the decoding and the augmenting thread both add

    def add(self, batch_done=False, **seconds):
        with self.lock:
            self.batches += batch_done
            for k, v in seconds.items():
                self.totals[k] += v

    def summary(self) -> dict:
        n = max(self.batches, 1)
        return {"batches": self.batches, **{k: v / n for k, v in self.totals.items()}}


class Epoch:
    """The iterator of one epoch: counts batches served (for state_dict) and moves to the next epoch
    at its end."""

    def __init__(self, loader, it):
        self.loader, self.it = loader, it

    def __iter__(self):
        return self

    def __next__(self):
        ld = self.loader
        while True:
            try:
                batch = next(self.it)
            except StopIteration:
                ld.epoch, ld.batches_served = ld.epoch + 1, 0
                raise
            ld.batches_served += 1
            ld.skipped.extend(batch.extra.get("bad", []))
            if batch.images is None:  # every sample of the batch was bad and skipped
                continue
            return ld._output(batch)

    def close(self):
        if hasattr(self.it, "close"):
            self.it.close()

    def __del__(self):
        self.close()


class CudaEpoch:
    """One epoch's batches off the loader's background threads, each batch's key checked against the
    one this epoch expects: threads that went on with other keys (another epoch was set, the seed
    changed, a resume) are replaced at the epoch's first batch."""

    def __init__(self, loader, keys: list, source):
        self.loader, self.keys, self.source, self.pos, self.stream = loader, keys, source, 0, None

    def __next__(self) -> HostBatch:
        ld = self.loader
        if self.pos == len(self.keys):
            raise StopIteration
        fresh = self.stream is None and ld._batches is None
        if self.stream is None:
            self.stream = ld._batches or ld._start_stream(self.source)
        batch = self._pull()
        if self.pos == 0 and not fresh and _key(batch) != self.keys[0]:
            self.stream = ld._start_stream(self.source)
            batch = self._pull()
        if batch is None:
            raise StopIteration
        if _key(batch) != self.keys[self.pos]:  # cannot happen: the stream serves its keys in order
            ld._close_stream(self.stream)
            raise RuntimeError(f"GPULoader: expected the batch of {self.keys[self.pos][:2]} at position {self.pos}, "
                               f"got {_key(batch)[:2]}")
        self.pos += 1
        if self.pos == len(self.keys) and not isinstance(self.source, Plan):  # the threads end with the epoch
            ld._close_stream(self.stream)
        return batch

    def _pull(self) -> Optional[HostBatch]:
        try:
            return self.stream.next_batch()
        except StopIteration:
            return None
        except BaseException:
            self.loader._close_stream(self.stream)
            raise

    def close(self):
        """An epoch left before its end stops its threads (they read ahead of where it stopped)."""
        if self.stream is not None and self.pos < len(self.keys):
            self.loader._close_stream(self.stream)


def _key(batch: Optional[HostBatch]):
    return None if batch is None else (batch.extra.get("epoch"), batch.extra.get("seed"), batch.indices)
