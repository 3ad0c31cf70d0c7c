"""How a batch travels from a DataLoader worker to the loader's process without per-batch costs.

torch hands a tensor from a worker to the main process through a fresh shared-memory file whose
descriptor is passed over a socket, with an authentication handshake in Python, per tensor and per
batch; the receiving process then maps pages it has never touched. Measured on a 2-core machine that
took about 6 ms per batch of 128 JPEGs (three tensors), much of it holding the GIL that the decoding
thread needs. So:

- the encoded bytes go into shared-memory slots that each worker allocates once and reuses: a slot's
  tensor crosses the process boundary once, and later batches name it (worker, slot, length);
  the main process frees a slot when the GPU work that read it has finished (an event, polled,
  never waited on), through a small flag table the workers can see;
- a taken slot's flag holds the generation of the key its batch was packed for (the loader starts
  a generation with each new pass of its threads): a batch the main process never started (left in
  a closed pass's queue, or dropped by the DataLoader when it reset) is never released, so its slot
  is free to keys of a later generation, and travels again with its next batch (the main process
  may never have seen it);
- small tensors (matrices, labels, boxes) travel by value, as numpy arrays in the pickle;
- the main process page-locks each slot in place once (cudaHostRegister), so the GPU decoder's copy
  of the bitstreams is a DMA queued on its stream, not a staging copy made by the decoder's threads,
  whose host work per image bounds the engine on small images (docs/dev/decode.md).

A worker that finds no free slot packs into a fresh tensor as before, so nothing can deadlock.
"""
from __future__ import annotations

import weakref
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

FREE = 0  # else a slot's flag is the generation (>= 1) of the key whose batch holds it

# The slots this worker process has allocated, per loader (a worker may serve several loaders).
_worker_slots: Dict[int, List[Optional[torch.Tensor]]] = {}


class SlotTable:
    """Per worker `slots` reusable byte buffers; the flags live in shared memory made before the
    workers start, so both sides see them."""

    def __init__(self, workers: int, slots: int, pin: bool = False):
        self.flags = torch.zeros(max(workers, 1), slots, dtype=torch.int32).share_memory_()
        self.token = id(self.flags)
        self.cached: Dict[Tuple[int, int], torch.Tensor] = {}   # main process: the slots received
        self.pending: List[Tuple[Tuple[int, int], torch.cuda.Event]] = []
        self.pinned: Dict[Tuple[int, int], torch.Tensor] = {}  # main process: the slots page-locked
        self._native = None  # orbbec's native module when the slots are page-locked
        if pin:
            from .._library import _C
            if hasattr(_C, "pin_host_memory"):
                self._native = _C
                weakref.finalize(self, _unpin_all, _C, self.pinned, self.pending)

    def __getstate__(self):
        return {"flags": self.flags, "token": self.token}

    def __setstate__(self, state):  # in a worker
        self.flags, self.token = state["flags"], state["token"]
        self.cached, self.pending, self.pinned, self._native = {}, [], {}, None

    # worker side ----------------------------------------------------------------------------
    def claim(self, worker: int, nbytes: int, generation: int = 1):
        """(slot, tensor, fresh) for `nbytes` in this worker's slots, for a key of `generation`, or
        None if all are taken. `fresh`: the tensor must travel with this batch (it is new, grown, or
        left by an earlier generation, whose batch the main process may never have received)."""
        flags = self.flags[worker].numpy()
        mine = _worker_slots.setdefault(self.token, [None] * flags.shape[0])
        free = np.flatnonzero((flags == FREE) | (flags < generation))
        if free.size == 0:
            return None
        # A free slot large enough, else the first free one, grown with headroom.
        fits = [s for s in free if mine[s] is not None and mine[s].numel() >= nbytes]
        s = int(fits[0]) if fits else int(free[0])
        fresh = not fits or flags[s] != FREE
        if not fits:
            mine[s] = torch.empty(max(nbytes + nbytes // 4, 1 << 16), dtype=torch.uint8).share_memory_()
        flags[s] = generation
        return s, mine[s], fresh

    # main side --------------------------------------------------------------------------------
    def attach(self, worker: int, slot: int, tensor: Optional[torch.Tensor]) -> torch.Tensor:
        """The slot's tensor: the one that came with this batch (kept for later batches) or the one
        received earlier. A slot is reused without its tensor only after release(), i.e. after its
        previous batch arrived here (a slot taken back from an earlier generation sends it again),
        so the cache is always current."""
        if tensor is not None:
            self.cached[(worker, slot)] = tensor
            if self._native is not None:
                self._pin_slot((worker, slot), tensor)
        return self.cached[(worker, slot)]

    def _pin_slot(self, key, tensor) -> None:
        """Page-locks a slot's new tensor; the one it replaces (a slot grown) is unlocked first: its
        last batch's GPU work has finished, or the worker could not have reused the slot."""
        old = self.pinned.pop(key, None)
        if old is not None:
            self._native.unpin_host_memory(old)
        if self._native.pin_host_memory(tensor):
            self.pinned[key] = tensor

    def begin_generation(self, generation: int) -> None:
        """A new pass of the loader's threads, whose keys carry `generation`: the slots whose GPU
        work has not yet run are marked with it, so that its keys do not take them (claim)."""
        self.poll()
        flags = self.flags.numpy()
        for (w, s), _ in self.pending:
            flags[w, s] = generation

    def release_after(self, worker: int, slot: int, event: "torch.cuda.Event") -> None:
        self.pending.append(((worker, slot), event))
        self.poll()

    def poll(self) -> None:
        """Frees the slots whose GPU work has finished (event.query() never blocks)."""
        still = []
        flags = self.flags.numpy()
        for (w, s), ev in self.pending:
            if ev.query():
                flags[w, s] = FREE
            else:
                still.append(((w, s), ev))
        self.pending[:] = still  # in place: the finaliser holds this list


def _unpin_all(native, pinned, pending) -> None:
    """When the table goes: the queued copies from its slots finish first (all precede the events of
    their batches' release), then every slot is unlocked."""
    try:
        for _, ev in pending:
            ev.synchronize()
        for t in pinned.values():
            native.unpin_host_memory(t)
        pinned.clear()
    except Exception:  # noqa: BLE001 (at interpreter exit CUDA may already be gone; nothing to free then)
        pass


class ByValue:
    """A small tensor that travels in the pickle as a numpy array."""

    def __init__(self, t: torch.Tensor):
        self.array = t.numpy()

    def tensor(self) -> torch.Tensor:
        return torch.from_numpy(self.array)


def map_leaves(fn, v):
    """A (nested) target with `fn` applied to each leaf: dicts and lists are rebuilt around them."""
    if isinstance(v, dict):
        return {k: map_leaves(fn, x) for k, x in v.items()}
    if isinstance(v, list):
        return [map_leaves(fn, x) for x in v]
    return fn(v)


def _to_value(v):
    if isinstance(v, torch.Tensor) and v.device.type == "cpu" and not v.requires_grad:
        try:
            return ByValue(v)
        except (TypeError, RuntimeError):
            pass
    return v


def by_value(v):
    """Tensors in a (nested) target -> ByValue, for the trip to the main process; a tensor numpy
    cannot hold (bfloat16, sparse, ...) travels as torch sends it."""
    return map_leaves(_to_value, v)


def from_value(v):
    """The inverse of by_value, in the main process."""
    return map_leaves(lambda x: x.tensor() if isinstance(x, ByValue) else x, v)
