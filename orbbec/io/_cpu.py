"""The CPU decode path: OpenCV's imdecode (libjpeg-turbo) in parallel threads. cv2 releases the
GIL while it decodes, so threads scale; inside a DataLoader worker one thread is the default, the
workers being the parallelism there."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from .._library import _C
from ._buffers import jpeg_segments, orient

_pool = None
_pool_threads = 0


def _cv2():
    try:
        import cv2
    except ImportError as exc:
        raise ImportError("decode_jpeg(device='cpu') needs OpenCV: pip install opencv-python-headless") from exc
    return cv2


def _cv2_message(e) -> str:
    """The reason in a cv2.error, without OpenCV's source path and line."""
    text = (getattr(e, "err", "") or str(e)).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _flags(cv2, mode, reduce, apply_exif):
    gray = mode == "GRAY"
    if reduce == 1:
        flags = cv2.IMREAD_GRAYSCALE if gray else cv2.IMREAD_COLOR
    else:
        name = ("IMREAD_REDUCED_GRAYSCALE_" if gray else "IMREAD_REDUCED_COLOR_") + str(reduce)
        flags = getattr(cv2, name)
    return flags if apply_exif else flags | cv2.IMREAD_IGNORE_ORIENTATION


def _decode_one(cv2, buf, mode, reduce, roi, apply_exif):
    problem = _C.jpeg_buffer_problem(buf)
    if problem:
        return None, problem
    try:
        img = cv2.imdecode(np.frombuffer(buf, dtype=np.uint8), _flags(cv2, mode, reduce, apply_exif))
    except cv2.error as e:  # e.g. a header whose size is past OpenCV's limit: this image fails, not the batch
        return None, f"OpenCV could not decode it ({_cv2_message(e)})"
    if img is None:
        return None, "corrupt or unsupported JPEG (OpenCV could not decode it)"
    if roi is not None:
        x, y, w, h = roi
        # roi is in the stored image's pixels; at reduce r the decoded image is ceil(size / r).
        full_h, full_w = img.shape[0] * reduce, img.shape[1] * reduce
        if x < 0 or y < 0 or w <= 0 or h <= 0 or (x + w > full_w) or (y + h > full_h):
            return None, f"roi {tuple(roi)} is not inside the image"
        img = img[y // reduce:-(-(y + h) // reduce), x // reduce:-(-(x + w) // reduce)]
    if mode == "RGB":
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    elif mode == "GRAY":
        img = img[:, :, None]
    return torch.from_numpy(np.ascontiguousarray(img)), ""


def decode_other_format(buf, mode):
    """An image in a format other than JPEG (PNG, BMP, WebP, TIFF, ...: whatever OpenCV reads) as a
    uint8 HWC tensor in `mode`, or (None, why not). Alpha is dropped and 16-bit samples are scaled
    to 8 bits (cv2.IMREAD_COLOR / IMREAD_GRAYSCALE); the EXIF orientation is ignored, as for JPEGs."""
    try:
        cv2 = _cv2()
    except ImportError:
        return None, "not a JPEG, and other formats need OpenCV: pip install opencv-python-headless"
    flags = (cv2.IMREAD_GRAYSCALE if mode == "GRAY" else cv2.IMREAD_COLOR) | cv2.IMREAD_IGNORE_ORIENTATION
    try:
        img = cv2.imdecode(np.frombuffer(buf, dtype=np.uint8), flags)
    except cv2.error as e:
        return None, f"not a JPEG, and OpenCV could not decode it ({_cv2_message(e)})"
    if img is None or img.size == 0:
        return None, "neither a JPEG nor an image OpenCV can decode"
    if mode == "RGB":
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    elif mode == "GRAY":
        img = img[:, :, None]
    return torch.from_numpy(np.ascontiguousarray(img)), ""


def decode(buffers, mode, reduces, rois, apply_exif, threads):
    """Returns (images, errors): a uint8 HWC CPU tensor or None per buffer, and '' or the reason."""
    global _pool, _pool_threads
    cv2 = _cv2()
    if threads is None:
        in_worker = torch.utils.data.get_worker_info() is not None
        threads = 1 if in_worker else (os.cpu_count() or 1)
    threads = max(1, min(int(threads), len(buffers)))
    args = list(zip(buffers, reduces, rois))
    if threads == 1:
        results = [_decode_one(cv2, b, mode, r, roi, apply_exif) for b, r, roi in args]
    else:
        if _pool is None or _pool_threads < threads:
            if _pool is not None:
                _pool.shutdown(wait=False)  # its threads finish their work and exit
            _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="orbbec-decode")
            _pool_threads = threads
        results = list(_pool.map(lambda a: _decode_one(cv2, a[0], mode, a[1], a[2], apply_exif), args))
    return [r[0] for r in results], [r[1] for r in results]


def exif_orientation(buf) -> int:
    """The EXIF orientation tag of a JPEG (1 when absent), read from its APP1 segment."""
    for marker, b, pos, length in jpeg_segments(buf):
        if marker == 0xE1 and bytes(b[pos + 4:pos + 10]) == b"Exif\0\0":
            tiff = bytes(b[pos + 10:pos + 2 + length])
            order = "little" if tiff[:2] == b"II" else "big"
            ifd = int.from_bytes(tiff[4:8], order)
            for k in range(int.from_bytes(tiff[ifd:ifd + 2], order)):
                e = ifd + 2 + 12 * k
                if int.from_bytes(tiff[e:e + 2], order) == 0x0112:
                    v = int.from_bytes(tiff[e + 8:e + 10], order)
                    return v if 1 <= v <= 8 else 1
            return 1
    return 1


__all__ = ["decode", "decode_other_format", "exif_orientation", "orient"]
