"""GPULoader: DataLoader workers read bytes and draw the augmentation; a background thread decodes
and augments each batch on the GPU on a side stream, `prefetch` batches ahead of the training step;
the consumer's stream waits on an event, so nothing synchronises the host in the steady state."""
from __future__ import annotations

import gc
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, List, Optional

import torch

from ..io import JpegDecodeError, start_decode
from ..io import last_call as io_last_call
from . import _order
from ._samples import HostBatch, prepare, select_rows
from ._shared import SlotTable

_DONE = object()


def _identity(x):
    return x


@dataclass
class _Config:
    """What the workers need of the loader. Kept apart from GPULoader so that the DataLoader does not
    point back at it: a DataLoader with persistent workers freed by the cycle collector waits 5 s per
    worker to shut down."""
    dataset: Any
    transform: Any
    device: torch.device
    mode: str
    on_error: str
    ragged: str
    box_min_visible: float
    flip_pairs: Any
    border_value: Any
    slots: Optional[SlotTable] = None  # reusable shared-memory buffers for the workers' bytes


class _Batches(torch.utils.data.Dataset):
    """Batches as a map-style dataset for torch's DataLoader (batch_size=None): the key is
    (epoch, seed, dataset indices), so that one set of persistent workers serves every epoch (the
    workers hold a copy of the configuration made when they started: what changes travels in the key)."""

    def __init__(self, cfg: _Config):
        self.cfg = cfg

    def __getitem__(self, key):
        cfg = self.cfg
        epoch, seed, indices = key
        batch = prepare(cfg.dataset, indices, transform=cfg.transform, seed=seed, epoch=epoch,
                        box_min_visible=cfg.box_min_visible, flip_pairs=cfg.flip_pairs, ragged=cfg.ragged)
        if cfg.device.type == "cpu":
            assemble(cfg, batch)  # the CPU path decodes and augments in the worker too
        else:
            info = torch.utils.data.get_worker_info()
            if info is not None:
                batch.pack(cfg.slots, info.id)
        return batch


class _EpochKeys(torch.utils.data.Sampler):
    """The keys of the epoch being read; set before each pass."""

    def __init__(self):
        self.keys = []

    def __iter__(self):
        return iter(list(self.keys))

    def __len__(self):
        return len(self.keys)


class GPULoader:
    """Iterates like torch's DataLoader over a Dataset whose items are an image (JPEG bytes, a path,
    or a decoded uint8 HWC array), a tuple (image, target, ...) or a dict with an "image" key and
    targets ("boxes" xyxy [N, 4] with per-box "labels", "keypoints" [K, 2|3], "landmarks" [5, 2], any
    other key collated as it is). Yields the items' structure with the image replaced by the
    augmented batch (a float32 NCHW tensor with `transform`, else a list of uint8 HWC tensors).

    batch_size, shuffle, sampler, drop_last, num_workers: DataLoader's meaning. Without a sampler the
        loader shards like DistributedSampler (rank and world_size from torch.distributed unless given).
    transform: an orbbec.augment.Compose; each sample's parameters come from (seed, epoch, index).
    device: where decoding and augmentation run ("cuda", "cuda:N", or "cpu": all of it in workers).
    prefetch: batches prepared ahead of the consumer (GPU path).
    on_error: "raise" (JpegDecodeError naming the dataset index) or "skip" (the sample is left out of
        its batch and its index added to `skipped`; the batch's other samples are kept).
    ragged: "padded" (boxes [B, N, 4] padded with zeros, labels with -1, counts in "num_boxes") or "list".
    return_params: also yield the drawn Params (matrices, flags) for debugging: (..., params) or ["params"].
    """

    def __init__(self, dataset, batch_size: int = 1, *, transform=None, shuffle: bool = False, sampler=None,
                 drop_last: bool = False, num_workers: int = 0, device=None, prefetch: int = 2, seed: int = 0,
                 on_error: str = "raise", mode: str = "RGB", rank: Optional[int] = None,
                 world_size: Optional[int] = None, ragged: str = "padded", return_params: bool = False,
                 box_min_visible: float = 0.0, flip_pairs=None, border_value=0):
        if batch_size < 1:
            raise ValueError(f"GPULoader: batch_size must be >= 1, got {batch_size}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"GPULoader: on_error must be 'raise' or 'skip', got {on_error!r}")
        if ragged not in ("padded", "list"):
            raise ValueError(f"GPULoader: ragged must be 'padded' or 'list', got {ragged!r}")
        if sampler is not None and shuffle:
            raise ValueError("GPULoader: sampler and shuffle are exclusive (as in DataLoader)")
        self.dataset, self.batch_size, self.transform = dataset, int(batch_size), transform
        self.shuffle, self.sampler, self.drop_last = shuffle, sampler, drop_last
        self.num_workers, self.prefetch, self.seed = int(num_workers), max(1, int(prefetch)), int(seed)
        self.return_params = return_params
        self.rank, self.world_size = _order.optional_world(rank, world_size)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.epoch, self.batches_served, self.skipped = 0, 0, []
        self._timing = _Timing()
        self._resume = False  # the next __iter__ continues the epoch (after load_state_dict)
        self._stream = None
        self._keys = _EpochKeys()
        # Workers start once and serve every epoch: forking them per epoch cost more than a short
        # epoch's decoding.
        slots = None
        if self.device.type == "cuda" and self.num_workers > 0:
            slots = SlotTable(self.num_workers, self.prefetch + 4)
        self._cfg = _Config(dataset, transform, self.device, mode, on_error, ragged, box_min_visible, flip_pairs,
                            border_value, slots)
        self._reader = torch.utils.data.DataLoader(
            _Batches(self._cfg), batch_size=None, sampler=self._keys, num_workers=self.num_workers, collate_fn=_identity,
            prefetch_factor=self.prefetch if self.num_workers else None, persistent_workers=self.num_workers > 0)

    def timing(self, reset: bool = False) -> dict:
        """Where the loader's background threads spent their time so far (GPU path), in seconds per
        batch: the decoding thread waiting for the workers' batches; decoding (host time of
        decode_jpeg), of which the decoder itself (`decode_native`) and taking Python's GIL back
        after it (`decode_gil`: other Python threads, e.g. the training loop's, held it); the
        augmenting thread's warp and target copies (`augment`, overlapping the next decode); and
        waiting for the consumer to take a batch (prefetch queue full: the loader is ahead). Large
        `workers` means more num_workers would help. reset=True starts the counts afresh (e.g. after a warm-up,
        whose first batches also size the decoder's buffers)."""
        out = self._timing.summary()
        if reset:
            self._timing = _Timing()
        return out

    # DataLoader / DistributedSampler interface -------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.batches_served = int(epoch), 0

    def state_dict(self) -> dict:
        """Where the loader stands: restore it with load_state_dict to resume mid-epoch."""
        return {"epoch": self.epoch, "batches_served": self.batches_served, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.batches_served = int(state["epoch"]), int(state["batches_served"])
        self.seed = int(state.get("seed", self.seed))
        self._resume = True

    def _indices(self) -> List[int]:
        if self.sampler is not None:
            return _order.sampler_indices(self.sampler, self.epoch)
        return _order.epoch_indices(len(self.dataset), shuffle=self.shuffle, seed=self.seed, epoch=self.epoch,
                                    rank=self.rank, world_size=self.world_size, drop_last=self.drop_last)

    def __len__(self) -> int:
        return _order.batch_count(len(self._indices()), self.batch_size, self.drop_last)

    def __iter__(self):
        skip = self.batches_served if self._resume else 0
        self._resume, self.batches_served = False, skip
        batches = _order.batches_of(self._indices(), self.batch_size, self.drop_last, skip=skip)
        self._keys.keys = [(self.epoch, self.seed, b) for b in batches]
        it = _CudaEpoch(self, self._reader) if self.device.type == "cuda" else start_workers(self._reader)
        return _Epoch(self, it)

    def _output(self, batch: HostBatch):
        if batch.kind == "dict":
            out = {"image": batch.images, **batch.targets}
            if self.return_params:
                out["params"] = batch.params
            return out
        if batch.kind == "tuple":
            out = (batch.images, *batch.targets)
            return out + (batch.params,) if self.return_params else out
        return (batch.images, batch.params) if self.return_params else batch.images


def start_workers(reader):
    """iter(reader), its workers forked (the first time) with the garbage collector frozen, so that a
    worker never collects what it inherits: a reference cycle holding a CUDA tensor, collected in a
    worker, freed it there, and CUDA aborted the forked process (seen in the CUDA tests; likely a
    block used on another stream, whose free records CUDA events)."""
    gc.freeze()
    try:
        return iter(reader)
    finally:
        gc.unfreeze()


def assemble(cfg: _Config, batch: HostBatch) -> None:
    """Decodes and augments a batch on cfg.device (in the current stream)."""
    decode_batch(cfg, batch)
    augment_batch(cfg, batch)


def decode_batch(cfg: _Config, batch: HostBatch) -> None:
    """Decodes the batch's images (in the current stream); leaves in batch.extra the images and the
    rows (samples) kept, and raises for a bad sample when on_error="raise"."""
    finish_decode(cfg, batch, start_decode_batch(cfg, batch))


def start_decode_batch(cfg: _Config, batch: HostBatch):
    """Starts decoding the batch's encoded images (on the GPU the decoder works on them while the
    caller goes on; on the CPU they are decoded now); None when there are none."""
    encoded = batch.buffers()
    pos = [i for i, e in enumerate(encoded) if e is not None]
    batch.extra["encoded_rows"] = pos
    t0 = time.perf_counter()
    started = start_decode([encoded[i] for i in pos], device=cfg.device, mode=cfg.mode) if pos else None
    batch.extra["start_s"] = time.perf_counter() - t0
    return started


def finish_decode(cfg: _Config, batch: HostBatch, started) -> None:
    """Takes the result of start_decode_batch (see decode_batch)."""
    pos = batch.extra.pop("encoded_rows")
    images = list(batch.decoded)
    t0 = time.perf_counter()
    if pos:
        decoded, _ = started.result()
        if cfg.device.type == "cuda":
            batch.extra["native_s"] = getattr(io_last_call, "native_s", 0.0)
            batch.extra["gil_s"] = getattr(io_last_call, "gil_s", 0.0)
        for i, img in zip(pos, decoded):
            images[i] = img
            if img is None and not batch.errors[i]:
                batch.errors[i] = "could not be decoded"
    rows = [i for i, img in enumerate(images) if img is not None and not batch.errors[i]]
    kept = set(rows)
    bad = [i for i in range(len(images)) if i not in kept]
    if bad and cfg.on_error == "raise":
        i = bad[0]
        raise JpegDecodeError(f"GPULoader: sample {batch.indices[i]} (position {i} of its batch): "
                              f"{batch.errors[i] or 'could not be decoded'}", batch.indices[i])
    batch.extra["rows"], batch.extra["bad"] = rows, [batch.indices[i] for i in bad]
    # The decoder's images are on cfg.device already; only images the dataset gave decoded may move.
    for i, given in enumerate(batch.decoded):
        if given is not None and images[i] is not None and images[i].device != cfg.device:
            images[i] = images[i].to(cfg.device, non_blocking=True)
    batch.extra["images"] = [images[i] for i in rows]
    batch.extra["decode_s"] = batch.extra.pop("start_s", 0.0) + time.perf_counter() - t0


def augment_batch(cfg: _Config, batch: HostBatch) -> None:
    """Warps (and normalises) the decoded images of decode_batch into batch.images; the targets keep
    the rows kept."""
    rows, images = batch.extra["rows"], batch.extra.pop("images")
    if not rows:
        batch.images = None
    elif cfg.transform is None:
        batch.images = images
    else:
        from ..augment import Params
        p = batch.params
        params = Params(p.matrices[rows] if len(rows) < len(p.samples) else p.matrices, p.size,
                        [p.samples[i] for i in rows])
        batch.params = params
        batch.images = cfg.transform.apply(images, params, border_value=cfg.border_value)
    if len(rows) < len(batch.indices):
        batch.targets = select_rows(batch, rows)


class _Timing:
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


class _Epoch:
    """The iterator of one epoch: counts batches served (for state_dict) and moves to the next epoch
    at its end."""

    def __init__(self, loader: GPULoader, it):
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


class _CudaEpoch:
    """Three background threads, so that each stage overlaps the others' next batch: one takes the
    workers' batches off the DataLoader (unpickling), one decodes them and one warps them, both on
    the loader's side stream (stream order keeps each warp after its decode); the results are handed
    over to the consumer's current stream."""

    def __init__(self, loader: GPULoader, reader):
        self.loader, self.reader = loader, reader
        if loader._stream is None:
            # High priority: the decoder's kernels and copies are short and the training step waits
            # for them; behind a step's long kernels they would stretch the decode of every batch.
            loader._stream = torch.cuda.Stream(loader.device, priority=-1)
        self.stream = loader._stream
        self.queue: "queue.Queue" = queue.Queue(maxsize=loader.prefetch)
        self.received: "queue.Queue" = queue.Queue(maxsize=2)
        self.decoded: "queue.Queue" = queue.Queue(maxsize=1)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._receive, name="orbbec-loader-receive", daemon=True),
                        threading.Thread(target=self._decode, name="orbbec-loader-decode", daemon=True),
                        threading.Thread(target=self._augment, name="orbbec-loader-augment", daemon=True)]
        for t in self.threads:
            t.start()

    def _put(self, item, q=None) -> bool:
        q = self.queue if q is None else q
        while not self.stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _receive(self):
        try:
            for batch in start_workers(self.reader):
                batch.unpack(self.loader._cfg.slots)
                if not self._put(batch, self.received):
                    return
            self._put(_DONE, self.received)
        except BaseException as e:  # handed on, raised in the consumer
            self._put(e, self.received)

    def _items(self, q):
        while True:
            try:
                item = q.get(timeout=0.1)
            except queue.Empty:
                if self.stop.is_set():  # closed early: the stage before has stopped too
                    return
                continue
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def _decode(self):
        """Starts each batch's decode, then finishes the batch before it, so that the decoder works on
        one batch while this thread's Python takes the previous one's results and receives the next
        (with the decode and its Python in turn, the decoder stood idle for a tenth of each batch)."""
        ld = self.loader
        pending = []  # [batch, its started decode, seconds waited for it], started and not yet finished
        try:
            torch.cuda.set_device(ld.device)
            with torch.cuda.stream(self.stream):
                t = time.perf_counter()
                for batch in self._items(self.received):
                    if self.stop.is_set():
                        return
                    waited = time.perf_counter() - t
                    pending.append((batch, self._start(batch), waited))
                    if len(pending) == 2 and not self._finish(*pending.pop(0)):
                        return
                    t = time.perf_counter()
                if pending and not self._finish(*pending.pop(0)):
                    return
            self._put(_DONE, self.decoded)
        except BaseException as e:  # handed on, raised in the consumer
            self._put(e, self.decoded)
        finally:
            # Stopped, or a batch raised: what was started is still decoded; its bytes are released
            # once the decoder is done reading them (the workers reuse those buffers).
            for batch, started, _ in pending:
                self._abandon(batch, started)

    def _start(self, batch):
        try:
            return start_decode_batch(self.loader._cfg, batch)
        except BaseException:
            self._release(batch)
            raise

    def _abandon(self, batch, started):
        """A started batch that will not be finished: its bytes are released once the decoder is
        done reading them."""
        try:
            if started is not None:
                started.result()
        except BaseException:  # noqa: BLE001 (the exception that stops the loader is the earlier one)
            pass
        self._release(batch)

    def _release(self, batch):
        """The batch's shared bytes are free once the GPU work queued so far has run."""
        if batch.slot is not None:
            event = torch.cuda.Event()
            event.record(self.stream)
            self.loader._cfg.slots.release_after(*batch.slot, event)
            batch.slot = None

    def _finish(self, batch, started, waited) -> bool:
        ld = self.loader
        try:
            finish_decode(ld._cfg, batch, started)
        finally:
            self._release(batch)
        x = batch.extra
        t = time.perf_counter()
        if not self._put(batch, self.decoded):
            return False
        ld._timing.add(workers=waited, decode=x.get("decode_s", 0.0), decode_native=x.get("native_s", 0.0),
                       decode_gil=x.get("gil_s", 0.0), augment_wait=time.perf_counter() - t)
        return True

    def _augment(self):
        ld = self.loader
        try:
            torch.cuda.set_device(ld.device)
            with torch.cuda.stream(self.stream):
                for batch in self._items(self.decoded):
                    if self.stop.is_set():
                        return
                    t1 = time.perf_counter()
                    augment_batch(ld._cfg, batch)
                    _pin_and_move(batch, ld.device)
                    event = torch.cuda.Event()
                    event.record(self.stream)
                    t2 = time.perf_counter()
                    if not self._put((batch, event)):
                        return
                    ld._timing.add(batch_done=True, augment=t2 - t1, consumer=time.perf_counter() - t2)
            self._put(_DONE)
        except BaseException as e:  # handed to the consumer, raised there
            self._put(e)

    def __next__(self) -> HostBatch:
        item = self.queue.get()
        if item is _DONE:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        batch, event = item
        consumer = torch.cuda.current_stream(self.loader.device)
        consumer.wait_event(event)
        for t in _tensors(batch):
            if t.is_cuda:
                t.record_stream(consumer)  # the allocator must not reuse them before the consumer is done
        return batch

    def close(self):
        self.stop.set()
        for t in self.threads:
            if t.is_alive() and threading.current_thread() is not t:
                t.join(timeout=10)


def _tensors(batch: HostBatch):
    stack = [batch.images, batch.targets, batch.params.matrices if batch.params is not None else None]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)


def _pin_and_move(batch: HostBatch, device) -> None:
    """Targets to the GPU from pinned memory, asynchronously on the current (side) stream."""
    def move(v):
        if isinstance(v, torch.Tensor):
            return v.pin_memory().to(device, non_blocking=True) if v.device.type == "cpu" else v
        if isinstance(v, dict):
            return {k: move(x) for k, x in v.items()}
        if isinstance(v, list):
            return [move(x) for x in v]
        return v
    batch.targets = move(batch.targets)
