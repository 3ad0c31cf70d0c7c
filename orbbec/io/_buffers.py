"""What every decode path shares: turning a Dataset's item into bytes, the error type, EXIF orientation."""
from __future__ import annotations

import os

import numpy as np
import torch
from ..common import ArgumentError, ArgumentTypeError


class JpegDecodeError(ValueError, RuntimeError):
    """An image of the batch could not be decoded; `.index` is its position in the batch. Derives
    from ValueError (bad input) and RuntimeError (what torchvision.io raises)."""

    def __init__(self, message: str, index: int = -1):  # index optional: DataLoader rebuilds it from the message
        super().__init__(message)
        self.index = index


def as_buffer(x, i: int, single: bool):
    """A zero-copy byte view of one encoded image."""
    where = "data" if single else f"data[{i}]"
    if isinstance(x, (bytes, bytearray, memoryview)):
        return x
    if isinstance(x, torch.Tensor):
        if x.dtype != torch.uint8 or x.dim() != 1:
            raise ArgumentError(f"decode_jpeg: {where} must be a 1-D uint8 tensor, got {x.dtype} of shape {tuple(x.shape)}")
        return x.detach().cpu().contiguous().numpy()
    if isinstance(x, np.ndarray):
        if x.dtype != np.uint8 or x.ndim != 1:
            raise ArgumentError(f"decode_jpeg: {where} must be a 1-D uint8 array, got {x.dtype} of shape {x.shape}")
        return np.ascontiguousarray(x)
    if isinstance(x, (str, os.PathLike)):
        raise ArgumentTypeError(f"decode_jpeg: {where} is a path; pass its bytes (orbbec.io.read_file(path))")
    raise ArgumentTypeError(f"decode_jpeg: {where} must be bytes, a 1-D uint8 numpy array or tensor, got {type(x).__name__}")


def orient(image: torch.Tensor, orientation: int) -> torch.Tensor:
    """Applies an EXIF orientation tag (1-8) to an HWC image, as cv2.imread does."""
    if orientation in (2, 4):
        return image.flip(1 if orientation == 2 else 0).contiguous()
    if orientation == 3:
        return image.flip(0).flip(1).contiguous()
    if orientation in (5, 6, 7, 8):
        t = image.transpose(0, 1)  # 5: transpose
        if orientation == 6:
            t = t.flip(1)  # rotate 90 clockwise
        elif orientation == 7:
            t = t.flip(0).flip(1)  # transverse
        elif orientation == 8:
            t = t.flip(0)  # rotate 90 counter-clockwise
        return t.contiguous()
    return image


# Start-of-frame markers (baseline, extended, progressive, lossless, arithmetic): they carry the size.
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def jpeg_segments(buf):
    """The header segments of a JPEG, before its first scan: (marker, view of the buffer, offset of
    the segment's FF byte, its length field). Stops at the scan, the end of the image, or anything
    that is not a marker. Reads the markers only: cheap enough for DataLoader workers."""
    b = memoryview(buf).cast("B") if not isinstance(buf, np.ndarray) else memoryview(buf)
    n = len(b)
    if n < 4 or b[0] != 0xFF or b[1] != 0xD8:
        return
    pos = 2
    while pos + 4 <= n and b[pos] == 0xFF:
        marker = b[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            pos += 2
            continue
        length = (b[pos + 2] << 8) | b[pos + 3]
        if marker in (0xD9, 0xDA) or length < 2:
            return
        yield marker, b, pos, length
        pos += 2 + length


def jpeg_size(buf):
    """(height, width) of the stored pixels from a JPEG's frame header, or None when the buffer has
    none (not a JPEG, or cut before it). DataLoader workers draw each sample's augmentation from it
    before the image is decoded."""
    for marker, b, pos, _ in jpeg_segments(buf):
        if marker in _SOF:
            if pos + 9 > len(b):
                return None
            h, w = (b[pos + 5] << 8) | b[pos + 6], (b[pos + 7] << 8) | b[pos + 8]
            return (h, w) if h > 0 and w > 0 else None
    return None
