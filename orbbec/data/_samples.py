"""What the CPU side of the loader does with a batch of dataset items (in DataLoader workers when
there are any): read the bytes, find each image's size in its header, draw the augmentation, move the
targets with it, and collate them. Only bytes, small arrays and the matrices travel to the GPU side."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

import numpy as np
import torch
from torch.utils.data import default_collate

from .._library import _C
from ..augment import transform_boxes, transform_keypoints, transform_landmarks
from ..augment._columns import names_of, values_of
from ..augment._targets import stacked_arrays
from ..common import ArgumentError
from ..io._buffers import with_height
from ._items import (BOX_ALIGNED_KEYS, BOX_KEYS, INSTANCE_MASK_KEYS, LANDMARK_KEYS, POINT_KEYS, image_source,
                     split_item, target_problem)
from ._masks import warp_masks
from ._rows import rows_to_decode
from ._shared import by_value, from_value


@dataclass
class HostBatch:
    indices: List[int]                       # dataset index of each sample
    encoded: List[Any]                       # bytes per sample (None when decoded / bad); packed by pack()
    decoded: List[Optional[torch.Tensor]]    # uint8 HWC tensor per sample given decoded
    errors: List[str]                        # '' or why the sample is bad
    kind: str                                # "dict", "tuple" or "image": the items' structure
    targets: Any = None                      # collated, batch-major (tensors with B rows or lists of B)
    params: Any = None                       # orbbec.augment.Params or None
    images: Optional[torch.Tensor] = None    # filled on the CPU path
    extra: dict = field(default_factory=dict)
    packed: Optional[torch.Tensor] = None    # all encoded bytes in one uint8 tensor (see pack)
    offsets: Optional[List[int]] = None
    slot: Optional[tuple] = None             # (worker, slot) of a reusable shared buffer (see pack)
    cut_rows: Optional[List[Optional[tuple]]] = None  # (frame, rows) where only the top rows are decoded

    def pack(self, slots=None, worker: int = 0, generation: int = 1) -> None:
        """Moves the encoded bytes into one uint8 tensor, a reusable slot of `slots` (a SlotTable)
        when one is free: DataLoader workers hand tensors over through shared memory, where bytes
        objects are pickled through a pipe (about 150 MB/s measured: the loader ran at a tenth of
        the decoder's rate on 1080p JPEGs). Small tensors go by value (see _shared.py)."""
        lengths = [0 if e is None else len(e) for e in self.encoded]
        total = sum(lengths)
        claimed = slots.claim(worker, total, generation) if slots is not None else None
        if claimed is None:
            tensor = torch.empty(total, dtype=torch.uint8)
        else:
            slot, tensor, fresh = claimed
            self.slot = (worker, slot)
        cuts = None if self.cut_rows is None else [None if c is None else (c[0].offset, c[1]) for c in self.cut_rows]
        self.offsets = _C.pack_buffers(self.encoded, tensor, cuts)
        self.packed = tensor if claimed is None or fresh else None
        self.encoded = [e is not None for e in self.encoded]
        self.cut_rows = None  # written into the packed copy
        self.targets = by_value(self.targets)
        if self.params is not None:
            self.params.matrices = by_value(self.params.matrices)

    def unpack(self, slots) -> None:
        """In the main process: the slot's tensor and the small tensors back (see pack)."""
        if self.slot is not None:
            self.packed = slots.attach(*self.slot, self.packed)
        self.targets = from_value(self.targets)
        if self.params is not None:
            self.params.matrices = from_value(self.params.matrices)

    def buffers(self) -> List[Any]:
        """The encoded bytes per sample (None where there are none), as zero-copy views (copies where
        the rows to decode are cut short: the dataset's own bytes stay as they are)."""
        if self.packed is None:
            if self.cut_rows is None:
                return self.encoded
            out = list(self.encoded)
            for k, cut in enumerate(self.cut_rows):
                if cut is not None and out[k] is not None:
                    out[k] = np.frombuffer(out[k], np.uint8).copy()
                    with_height(out[k], *cut)
            return out
        flat = self.packed.numpy()
        return [flat[self.offsets[i]:self.offsets[i + 1]] if has else None for i, has in enumerate(self.encoded)]


def _flips(samples) -> List[bool]:
    """Whether each sample was flipped left and right."""
    return [bool(f) for f in values_of(samples, "RandomHorizontalFlip.hflip", False)]


def _move_boxes(targets: List[dict], M: torch.Tensor, size, box_min_visible) -> None:
    """The boxes of the whole batch in one transform_boxes call, each box with its sample's matrix
    (one call per sample cost a detection worker more than the rest of its batch), and their
    per-box keys (labels) kept with them. All in numpy (a small torch op costs a worker several times
    a numpy one's host time); each sample's boxes come out as a numpy view."""
    for k in BOX_KEYS:
        have = [b for b, t in enumerate(targets) if k in t]
        if not have:
            continue
        boxes = [_float32_boxes(targets[b][k]) for b in have]
        counts = np.fromiter(map(len, boxes), np.int64, len(boxes))
        sample = np.repeat(np.arange(len(have)), counts)  # each box's place in `have`
        moved, kept = transform_boxes(np.concatenate(boxes), M.numpy()[np.asarray(have)[sample]], size,
                                      box_min_visible)
        box_end = np.cumsum(counts).tolist()
        kept_end = np.cumsum(np.bincount(sample[kept], minlength=len(have))).tolist()
        box_start, kept_start = 0, 0
        for b, box_stop, kept_stop in zip(have, box_end, kept_end):
            targets[b][k] = moved[kept_start:kept_stop]
            keep = kept[box_start:box_stop]
            for pk in BOX_ALIGNED_KEYS:
                if pk in targets[b]:
                    targets[b][pk] = _rows_kept(targets[b][pk], keep)
            box_start, kept_start = box_stop, kept_stop


def _float32_boxes(v) -> np.ndarray:
    """A sample's boxes as float32 [N, 4] (numpy rounds to float32 as torch.as_tensor does)."""
    if isinstance(v, torch.Tensor):
        return v.detach().to(torch.float32).reshape(-1, 4).numpy()
    return np.asarray(v, dtype=np.float32).reshape(-1, 4)


def _rows_kept(v, keep: np.ndarray):
    """A per-box value (labels, masks) at the boxes kept; numpy stays numpy (its dtype kept), the
    rest becomes a tensor as before (a list of floats: torch's float32)."""
    if isinstance(v, np.ndarray):
        return v[keep]
    return torch.as_tensor(v)[torch.from_numpy(keep)]


def _drop_boxes_left_out(targets: List[dict], samples: List[dict]) -> None:
    """Drops the boxes (and their per-box keys) that a transform left out of its sample's params
    ("<Transform>.keep": RandomIoUCrop keeps the boxes whose centre lies in its crop)."""
    if not any(name.endswith(".keep") for name in names_of(samples)):
        return  # (most chains: one look at the batch's names instead of every sample's)
    for target, sample in zip(targets, samples):
        for name, keep in sample.items():
            if not name.endswith(".keep") or keep is None:
                continue
            mask = torch.tensor(keep, dtype=torch.bool)
            for k in BOX_KEYS:
                if k in target:
                    target[k] = torch.as_tensor(target[k], dtype=torch.float32).reshape(-1, 4)[mask]
            for k in BOX_ALIGNED_KEYS:
                if k in target:
                    target[k] = torch.as_tensor(target[k])[mask]


def _move_keypoints(target: dict, M, b: int, size, flipped, flip_pairs) -> dict:
    """A copy of sample b's target (the dataset's own dict stays as it is) with its keypoints moved by
    M[b] (taken only where there are keypoints: indexing M for every sample cost a face batch 0.3 ms)."""
    out = dict(target)
    for k in POINT_KEYS:
        if k in target:
            pts = torch.as_tensor(target[k], dtype=torch.float32)
            xy, inside = transform_keypoints(pts[..., :2], M[b], size, flipped, flip_pairs)
            vis = inside if pts.shape[-1] < 3 else inside & (pts[..., 2] > 0)
            out[k] = torch.cat([xy, vis.unsqueeze(-1).to(xy.dtype)], dim=-1)
    return out


def _move_landmarks(targets: List[dict], M: torch.Tensor, size, flipped: List[bool]) -> dict:
    """Face landmarks of the whole batch in one call where they all have one shape (one call per
    sample cost a worker more than the rest of a face batch), else sample by sample. Returns those
    moved for every sample of the batch at once, {key: [B, K, D]}: collate_dicts takes them as they
    are (what stacking the samples' rows again would give), and their samples' own values are left
    unmoved."""
    whole = {}
    for k in LANDMARK_KEYS:
        have = [b for b, t in enumerate(targets) if k in t]
        if not have:
            continue
        values = [targets[b][k] for b in have]
        stacked = _stacked_points(values)
        if stacked is not None:  # (in numpy: a small torch op costs a worker several times a numpy one)
            moved, _ = transform_landmarks(stacked, M.numpy()[have], size, np.array([flipped[b] for b in have]))
            moved = torch.from_numpy(moved)
            if len(have) == len(targets):
                whole[k] = moved
                continue
            for b, row in zip(have, moved.unbind(0)):
                targets[b][k] = row
        else:
            for b, v in zip(have, values):
                targets[b][k], _ = transform_landmarks(torch.as_tensor(v, dtype=torch.float32), M[b], size, flipped[b])
    return whole


def _stacked_points(values) -> "np.ndarray | None":
    """The samples' points as one float32 array [n, K, D], or None when they are not all 2-D of one
    shape (numpy arrays of one shape are converted at once: stacked_arrays)."""
    same = stacked_arrays(values)
    if same is not None:
        return same.astype(np.float32) if same.ndim == 3 else None
    pts = [torch.as_tensor(v, dtype=torch.float32) for v in values]
    if pts[0].dim() == 2 and all(p.shape == pts[0].shape for p in pts):
        return torch.stack(pts).numpy()
    return None


# Per-box values padded in numpy when every sample's are numpy arrays of one of these dtypes (for
# other dtypes numpy's and torch's casts of the fill differ).
NUMPY_PAD_DTYPES = (np.float32, np.float64, np.int64, np.int32)


def _pad(values: list, fill) -> tuple:
    """Ragged [N_i, ...] -> ([B, max N, ...] padded with `fill`, counts [B]); in numpy where every
    value is a numpy array of one NUMPY_PAD_DTYPES dtype (a small torch op costs a worker several
    times a numpy one), else in torch."""
    counts = [len(v) for v in values]
    in_numpy = bool(values) and all(isinstance(v, np.ndarray) for v in values) \
        and len({v.dtype for v in values}) == 1 and values[0].dtype in NUMPY_PAD_DTYPES
    rows = values if in_numpy else [torch.as_tensor(v) for v in values]
    ref = max(rows, key=lambda a: a.ndim) if rows else torch.zeros(0)
    rest = tuple(ref.shape[1:])
    shape = (len(rows), max(counts, default=0)) + rest
    out = np.full(shape, fill, dtype=ref.dtype) if in_numpy else torch.full(shape, fill, dtype=ref.dtype)
    for i, (a, n) in enumerate(zip(rows, counts)):
        if n:
            out[i, :n] = a.reshape((n,) + rest)
    return (torch.from_numpy(out) if in_numpy else out), torch.tensor(counts, dtype=torch.int64)


def collate_dicts(targets: List[dict], ragged: str, collated: Optional[dict] = None) -> dict:
    """Boxes (and their labels) padded with per-sample counts ("num_boxes"), or lists when
    ragged="list"; everything else stacked when it can be, else kept as a list. `collated`: keys
    already batched (_move_landmarks'), taken as they are."""
    out = {}
    for k in targets[0]:
        if collated and k in collated:
            out[k] = collated[k]
            continue
        values = [t[k] for t in targets]
        if k in BOX_KEYS + BOX_ALIGNED_KEYS and ragged == "padded":
            fill = 0 if k in BOX_KEYS + INSTANCE_MASK_KEYS else -1
            out[k], counts = _pad(values, fill)
            if k in BOX_KEYS:
                out["num_" + k] = counts
        elif k in BOX_KEYS + BOX_ALIGNED_KEYS:
            out[k] = [torch.as_tensor(v) for v in values]
        else:
            out[k] = _collate(values)
    return out


def _read_item(dataset, index):
    """dataset[index]; an exception it raises keeps its type and says which sample raised it (in a
    worker, DataLoader re-raises it in the main process with the note in its traceback)."""
    try:
        return dataset[index]
    except Exception as e:
        if hasattr(e, "add_note"):  # Python 3.11+
            e.add_note(f"GPULoader: raised by dataset[{index}]")
        raise


def prepare(dataset, indices: List[int], *, transform, seed: int, epoch: int, box_min_visible: float,
            flip_pairs, ragged: str, partial_decode: bool = False, mode: str = "RGB") -> HostBatch:
    """The CPU side of a batch (see the module's doc). partial_decode: decode each JPEG only down to
    the last rows its warp reads (orbbec/data/_rows.py). mode: the channels of images in other
    formats than JPEG, which are decoded here."""
    items = [_read_item(dataset, i) for i in indices]
    split = [split_item(it) for it in items]
    kinds = {k for _, _, k in split}
    if len(kinds) > 1:
        raise TypeError(f"GPULoader: the items of one batch differ in structure ({sorted(kinds)})")
    kind = kinds.pop()
    sources = [image_source(img, mode) for img, _, _ in split]
    batch = HostBatch(indices=list(indices), encoded=[s[0] for s in sources], decoded=[s[1] for s in sources],
                      errors=[s[3] for s in sources], kind=kind)
    targets = [t for _, t, _ in split]
    if kind == "dict":
        for t, index in zip(targets, indices):
            problem = target_problem(t)
            if problem:
                raise ArgumentError(f"GPULoader: sample {index}: {problem}")
    if transform is not None:
        batch.params = transform.draw([s[2] for s in sources], indices, epoch=epoch, seed=seed,
                                      targets=targets if kind == "dict" else None)
        if partial_decode:
            rows = rows_to_decode(batch.params.matrices.numpy(), batch.params.size, [s[4] for s in sources])
            if any(r is not None for r in rows):
                batch.cut_rows = [None if r is None else (s[4], r) for s, r in zip(sources, rows)]
    if kind == "dict":
        collated = None
        if batch.params is not None:
            M, size = batch.params.matrices, batch.params.size
            flipped = _flips(batch.params.samples)
            targets = [_move_keypoints(t, M, b, size, flipped[b], flip_pairs) for b, t in enumerate(targets)]
            warp_masks(targets, M, size, [s[2] for s in sources], indices, batch.errors)
            _drop_boxes_left_out(targets, batch.params.samples)
            _move_boxes(targets, M, size, box_min_visible)
            collated = _move_landmarks(targets, M, size, flipped)
        batch.targets = collate_dicts(targets, ragged, collated)
    elif kind == "tuple":
        batch.targets = [_collate([t[j] for t in targets]) for j in range(len(targets[0]))]
    return batch


def _collate(values):
    """DataLoader's collation where it applies, else the list of values (ragged, or not tensors)."""
    try:
        return default_collate(values)
    except (RuntimeError, TypeError, ValueError):
        return values


def select_rows(batch: HostBatch, rows: List[int]):
    """The collated targets of the samples `rows` (those that decoded)."""
    def column(v):
        if isinstance(v, torch.Tensor):
            return v.index_select(0, torch.tensor(rows, dtype=torch.long)) if v.dim() else v
        return [v[r] for r in rows]
    if batch.kind == "dict":
        return {k: column(v) for k, v in batch.targets.items()}
    if batch.kind == "tuple":
        return [column(c) for c in batch.targets]
    return None
