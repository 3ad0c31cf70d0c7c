"""What the loader reads of a dataset item: its image (encoded bytes, a path, a decoded array, or a
file in another format, decoded here) and its targets, checked before they follow the image."""
from __future__ import annotations

import os

import numpy as np
import torch

from ..io import read_file
from ..io._buffers import inspect_jpeg
from ..io._cpu import decode_other_format

# Dict keys that move with the image (everything else is collated as it is).
BOX_KEYS = ("boxes",)
PER_BOX_KEYS = ("labels",)
POINT_KEYS = ("keypoints",)
LANDMARK_KEYS = ("landmarks",)
MASK_KEYS = ("mask",)              # [H, W]: a label per pixel (semantic segmentation)
INSTANCE_MASK_KEYS = ("masks",)    # [N, H, W]: one mask per box (instance segmentation)
BOX_ALIGNED_KEYS = PER_BOX_KEYS + INSTANCE_MASK_KEYS  # kept or dropped with their boxes


def split_item(item):
    """(image, targets, kind) of a dataset item: a dict with an "image" key, a tuple (image, ...) or
    the image alone."""
    if isinstance(item, dict):
        if "image" not in item:
            raise KeyError("GPULoader: a dataset item that is a dict needs an 'image' key")
        return item["image"], {k: v for k, v in item.items() if k != "image"}, "dict"
    if isinstance(item, tuple) and item and not isinstance(item, (bytes, bytearray)):
        return item[0], list(item[1:]), "tuple"
    return item, None, "image"


def _bad(why):
    return None, None, (1, 1), why, None


def _decoded_problem(t: torch.Tensor, mode: str) -> str:
    channels = 1 if mode == "GRAY" else 3
    if t.dtype != torch.uint8:
        return f"a decoded image must be uint8 HWC, got {t.dtype}"
    if t.shape[0] < 1 or t.shape[1] < 1 or t.shape[2] != channels:
        return f"a decoded image must be uint8 [H, W, {channels}] for mode {mode!r}, got shape {tuple(t.shape)}"
    return ""


def image_source(image, mode: str):
    """(encoded bytes, decoded tensor, (h, w), error, JPEG frame header) of a dataset item's image.
    Files in other formats (PNG, BMP, WebP, ...; ImageNet has a PNG and BMPs under .JPEG names) are
    decoded here, in the worker, by OpenCV: the GPU decoder reads JPEGs only."""
    if type(image) is not bytes:  # the usual item skips the checks for other kinds (0.15 ms of a face batch)
        image, done = _other_kind(image, mode)
        if done is not None:
            return done
    # The decoders' own checks (cut short, a size the file cannot hold), made before the loader
    # rewrites the header's height for a partial decode. Bytes are read as they are (a numpy view
    # per sample cost a face worker's batch about 0.2 ms) and get their view below only when they
    # are not a JPEG; other buffers are read through their view.
    problem, frame = inspect_jpeg(image if isinstance(image, (bytes, bytearray)) else _uint8_view(image))
    if frame is not None:
        return _bad(problem) if problem else (image, None, (frame.height, frame.width), "", frame)
    buf = _uint8_view(image)
    if buf.size == 0:
        return _bad("empty (0 bytes)")
    if buf[:2].tobytes() == b"\xff\xd8":  # a broken JPEG keeps its JPEG error
        return _bad(problem or "no JPEG frame header (SOF) found")
    decoded, problem = decode_other_format(buf, mode)
    if decoded is None:
        return _bad(problem)
    return None, decoded, (int(decoded.shape[0]), int(decoded.shape[1])), "", None


def _other_kind(image, mode: str):
    """(the item's encoded buffer, None) for anything but bytes, or (None, image_source's result) for
    a decoded image, a path that cannot be read, or a kind the loader does not take."""
    if isinstance(image, (str, os.PathLike)):
        try:
            image = read_file(image)
        except OSError as e:
            return None, _bad(f"cannot read {image!r}: {e.strerror or e}")
    if isinstance(image, (torch.Tensor, np.ndarray)) and image.ndim == 3:
        t = torch.as_tensor(image)
        problem = _decoded_problem(t, mode)
        return None, (_bad(problem) if problem else (None, t, (int(t.shape[0]), int(t.shape[1])), "", None))
    if isinstance(image, torch.Tensor):
        image = image.detach().cpu().numpy()
    if isinstance(image, np.ndarray) and (image.ndim != 1 or image.dtype != np.uint8):
        return None, _bad(f"the image must be encoded bytes (1-D uint8) or a decoded uint8 HWC array, got "
                          f"{image.dtype} of shape {image.shape}")
    if not isinstance(image, (bytes, bytearray, memoryview, np.ndarray)):
        return None, _bad(f"the image must be encoded bytes, a path or a uint8 HWC array, got {type(image).__name__}")
    return image, None


def _uint8_view(image) -> np.ndarray:
    return np.frombuffer(image, np.uint8) if not isinstance(image, np.ndarray) else image


def _shape_of(value):
    """(shape, '') of an array of numbers, or (None, why not). Arrays give their shape without a
    copy: masks are large, and this runs for every sample in the workers."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), ""
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return value.shape, ""
    try:
        return tuple(np.asarray(value, dtype=np.float64).shape), ""
    except (TypeError, ValueError, RuntimeError) as e:
        return None, f"not an array of numbers ({e})"


# (keys, whether a shape fits given the sample's box count or None, what is expected), boxes first:
# the others are checked against their count.
_TARGET_SHAPES = [
    (BOX_KEYS, lambda s, n: s in ((0,), (4,)) or (len(s) == 2 and s[1] == 4), "be [N, 4] (x1, y1, x2, y2)"),
    (PER_BOX_KEYS, lambda s, n: n is None or s == (n,), "hold one value per box"),
    (INSTANCE_MASK_KEYS, lambda s, n: len(s) == 3 and (n is None or s[0] == n), "be [N, H, W], one mask per box"),
    (MASK_KEYS, lambda s, n: len(s) == 2, "be [H, W], a label per pixel"),
    (POINT_KEYS, lambda s, n: len(s) >= 2 and s[-1] in (2, 3), "be [K, 2] (x, y) or [K, 3] (x, y, visible)"),
    (LANDMARK_KEYS, lambda s, n: s == (5, 2), "be [5, 2] (eyes, nose, mouth corners)"),
]


# The same checks one key at a time, in that order (one loop instead of two nested: face's batch of
# 256 0.18 -> 0.14 ms), and the keys they read: a target without any of them (a label alone) is done
# at once (0.04 -> 0.01 ms per classification batch of 128).
_CHECKS = [(k, keys, fits, expected) for keys, fits, expected in _TARGET_SHAPES for k in keys]
_CHECKED_KEYS = frozenset(k for k, _, _, _ in _CHECKS)


def target_problem(target: dict) -> str:
    """'' or why a sample's targets cannot follow its image: a mistake in the dataset's code, raised
    naming the sample whatever on_error says (on_error is for files that cannot be read)."""
    if _CHECKED_KEYS.isdisjoint(target):
        return ""
    n_boxes = None
    for k, keys, fits, expected in _CHECKS:
        if k not in target:
            continue
        shape, why = _shape_of(target[k])
        if why or not fits(shape, n_boxes):
            count = f" ({n_boxes})" if keys is PER_BOX_KEYS else ""
            return f"{k!r} must {expected}{count}, got " + (why or f"shape {shape}")
        if keys is BOX_KEYS:
            n_boxes = 1 if shape == (4,) else shape[0]
    return ""
