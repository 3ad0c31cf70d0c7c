"""GPULoader: DataLoader workers read bytes and draw the augmentation; background threads decode
and augment each batch on the GPU on a side stream, `prefetch` batches ahead of the training step
(_stream.py); the consumer's stream waits on an event, so nothing synchronises the host in the steady
state."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, List, Optional

import torch

from ..common import ArgumentTypeError
from ..common.cuda_connections import warn_if_cuda_started_first
from ..augment._columns import as_list
from . import _order
from ._samples import HostBatch, prepare
from ._shared import SlotTable
from ._stages import assemble
from ._epoch import CudaEpoch, Epoch, Timing
from ._keys import Keys, Plan, keys_of
from ._stream import DECODES_IN_FLIGHT, RECEIVED_DEPTH, Counters, GpuStream, start_workers

# The side stream's priority. High (-1): the decoder's kernels and copies are short and the training
# step waits for them; behind a step's long kernels they would stretch the decode of every batch.
SIDE_STREAM_PRIORITY = -1


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
    partial_decode: bool = True


class _Batches(torch.utils.data.Dataset):
    """Batches as a map-style dataset for torch's DataLoader (batch_size=None): the key is
    (epoch, seed, dataset indices), so that one set of persistent workers serves every epoch (the
    workers hold a copy of the configuration made when they started: what changes travels in the key)."""

    def __init__(self, cfg: _Config):
        self.cfg = cfg

    def __getitem__(self, key):
        cfg = self.cfg
        epoch, seed, indices, generation, seq = key
        batch = prepare(cfg.dataset, indices, transform=cfg.transform, seed=seed, epoch=epoch,
                        box_min_visible=cfg.box_min_visible, flip_pairs=cfg.flip_pairs, ragged=cfg.ragged,
                        partial_decode=cfg.partial_decode and cfg.device.type == "cuda", mode=cfg.mode)
        batch.extra["epoch"], batch.extra["seed"] = epoch, seed  # the consumer checks the key it gets
        batch.extra["seq"] = seq  # a batch's error is raised at its position (_reorder.py)
        if cfg.device.type == "cpu":
            assemble(cfg, batch)  # the CPU path decodes and augments in the worker too
        else:
            info = torch.utils.data.get_worker_info()
            if info is not None:
                batch.pack(cfg.slots, info.id, generation)
        return batch


# DataLoader arguments that have no place here, and what to use instead.
_DATALOADER_ONLY = {
    "collate_fn": "the loader collates the image batch itself, and the targets as docs/data.md says (ragged= for "
                  "boxes); other keys are collated as default_collate does, or kept as lists",
    "batch_sampler": "give batch_size with a sampler (or shuffle); every output has the transform's one size, so "
                     "grouping by aspect ratio gains nothing",
    "generator": "give seed=: each sample's augmentation and the shuffled order come from (seed, epoch, index)",
}


def _refuse_dataloader_only(**given) -> None:
    for name, value in given.items():
        if value is not None:
            raise ArgumentTypeError(f"GPULoader: {name} is DataLoader's, not taken here: {_DATALOADER_ONLY[name]}")


class GPULoader:
    """Iterates like torch's DataLoader over a Dataset whose items are an image (JPEG bytes, a path,
    or a decoded uint8 HWC array; PNG and other formats are decoded by OpenCV in the workers), a
    tuple (image, target, ...) or a dict with an "image" key and targets ("boxes" xyxy [N, 4] with
    per-box "labels" and "masks" [N, H, W], "keypoints" [K, 2|3], "landmarks" [5, 2], a "mask" [H, W]
    of labels; any other key collated as it is). Yields the items' structure with the image replaced by the
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
    worker_init_fn, multiprocessing_context, timeout, prefetch_factor: passed to the workers' DataLoader.
        pin_memory and persistent_workers are accepted and change nothing (batches come out on `device`;
        workers always persist); collate_fn, batch_sampler and generator raise, saying what to use.
    partial_decode: on the GPU, decode each JPEG only down to the last row its warp reads (a random
        crop's bottom plus a few rows): the rest is never entropy-decoded, and the warp's pixels are
        those of the whole image's decode. The decoder may then take another of its two paths for
        the shorter image (docs/io.md), whose pixels differ slightly. False decodes every row.
    """

    def __init__(self, dataset, batch_size: int = 1, *, transform=None, shuffle: bool = False, sampler=None,
                 drop_last: bool = False, num_workers: int = 0, device=None, prefetch: int = 2, seed: int = 0,
                 on_error: str = "raise", mode: str = "RGB", rank: Optional[int] = None,
                 world_size: Optional[int] = None, ragged: str = "padded", return_params: bool = False,
                 box_min_visible: float = 0.0, flip_pairs=None, border_value=0, partial_decode: bool = True,
                 worker_init_fn=None, multiprocessing_context=None, timeout: float = 0,
                 prefetch_factor: Optional[int] = None, pin_memory: bool = False, persistent_workers: bool = True,
                 collate_fn=None, batch_sampler=None, generator=None):
        _refuse_dataloader_only(collate_fn=collate_fn, batch_sampler=batch_sampler, generator=generator)
        if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__getitem__") \
                or not hasattr(dataset, "__len__"):
            raise ArgumentTypeError(
                f"GPULoader: dataset must be map-style (__getitem__ and __len__), got {type(dataset).__name__}: each "
                "sample's order, shard and augmentation come from its index; read a stream (an IterableDataset, "
                "tar shards) through an index of its items")
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
        self._counters = Counters(Timing())
        self._resume = False  # the next __iter__ continues the epoch (after load_state_dict)
        self._cuda_stream = None  # the side stream of the GPU path
        self._batches: Optional[GpuStream] = None  # the GPU path's background threads, across epochs
        self._keys = Keys()
        # Workers start once and serve every epoch: forking them per epoch cost more than a short
        # epoch's decoding.
        slots = None
        if self.device.type == "cuda" and self.num_workers > 0:
            # ORBBEC_PIN_SLOTS=0 leaves the slots pageable (for comparison: docs/dev/decode.md).
            pin = os.environ.get("ORBBEC_PIN_SLOTS", "1") != "0"
            # A worker's batches in flight: its prefetch in the DataLoader plus, at most, all those the
            # loader's threads hold before their release; slots are allocated only when used, so the
            # spare ones cost nothing.
            slots = SlotTable(self.num_workers, self.prefetch + RECEIVED_DEPTH + DECODES_IN_FLIGHT, pin=pin)
        self._cfg = _Config(dataset, transform, self.device, mode, on_error, ragged, box_min_visible, flip_pairs,
                            border_value, slots, bool(partial_decode))
        # pin_memory and persistent_workers are taken for DataLoader's sake and change nothing: the
        # batches come out on `device` (nothing to pin), and the workers always persist.
        self._reader = torch.utils.data.DataLoader(
            _Batches(self._cfg), batch_size=None, sampler=self._keys, num_workers=self.num_workers, collate_fn=_identity,
            prefetch_factor=(prefetch_factor or self.prefetch) if self.num_workers else None,
            persistent_workers=self.num_workers > 0, worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context, timeout=timeout)

    def timing(self, reset: bool = False) -> dict:
        """Where the loader's background threads spent their time so far (GPU path), in seconds per
        batch: the decoding thread waiting for the workers' batches; decoding (host time of
        decode_jpeg), of which the decoder itself (`decode_native`) and taking Python's GIL back
        after it (`decode_gil`: other Python threads, e.g. the training loop's, held it); the
        augmenting thread's warp and target copies (`augment`, overlapping the next decode); and
        waiting for the consumer to take a batch (prefetch queue full: the loader is ahead). Large
        `workers` means more num_workers would help. reset=True starts the counts afresh (e.g. after a warm-up,
        whose first batches also size the decoder's buffers)."""
        out = self._counters.timing.summary()
        if reset:
            self._counters.timing = Timing()
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
        return Plan(self, self.epoch, 0).indices(self.epoch)

    def __len__(self) -> int:
        return _order.batch_count(len(self._indices()), self.batch_size, self.drop_last)

    def __iter__(self):
        skip = self.batches_served if self._resume else 0
        self._resume, self.batches_served = False, skip
        # What the workers read: with the loader's own order a plan that goes on into the next epochs
        # (the GPU path's threads read ahead); with a user's sampler (whose next order is the
        # user's) this epoch's keys only.
        if self.sampler is None:
            source = Plan(self, self.epoch, skip)
            keys = source.keys(self.epoch, skip)
        else:
            keys = source = keys_of(self.epoch, self.seed, self._indices(), self.batch_size, self.drop_last, skip)
        if self.device.type == "cuda":
            return Epoch(self, CudaEpoch(self, keys, source))
        self._keys.source = keys
        return Epoch(self, start_workers(self._reader))

    def _start_stream(self, source) -> GpuStream:
        """Background threads reading the keys of `source` (a Plan or a list)."""
        self._close_stream()
        self._keys.source = source
        # A new generation of keys: the slots of batches the old threads received but never started,
        # and of those the DataLoader dropped when it reset, become free for the new keys' batches
        # (SlotTable.claim); those whose GPU work may still run stay taken until it has run.
        self._keys.generation += 1
        if self._cfg.slots is not None:
            self._cfg.slots.begin_generation(self._keys.generation)
        if self._cuda_stream is None:
            warn_if_cuda_started_first()
            self._cuda_stream = torch.cuda.Stream(self.device, priority=SIDE_STREAM_PRIORITY)
        self._batches = GpuStream(self._reader, self._cfg, self._counters, self._cuda_stream, self.prefetch)
        return self._batches

    def _close_stream(self, stream: Optional[GpuStream] = None, wait: bool = True) -> None:
        """Stops the background threads (`stream`'s only if it is still the loader's)."""
        s = self._batches
        if s is not None and (stream is None or stream is s):
            self._batches = None
            if wait:  # before the DataLoader is iterated again: one pass at a time
                s.close()
            else:
                s.stop.set()

    def __del__(self):
        try:
            self._close_stream(wait=False)
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass

    def _output(self, batch: HostBatch):
        if self.return_params and batch.params is not None:
            batch.params.samples = as_list(batch.params.samples)  # (a batch's draws keep columns: augment/_columns.py)
        if batch.kind == "dict":
            out = {"image": batch.images, **batch.targets}
            if self.return_params:
                out["params"] = batch.params
            return out
        if batch.kind == "tuple":
            out = (batch.images, *batch.targets)
            return out + (batch.params,) if self.return_params else out
        return (batch.images, batch.params) if self.return_params else batch.images
