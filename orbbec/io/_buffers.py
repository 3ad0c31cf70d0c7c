"""What every decode path shares: turning a Dataset's item into bytes, the error type, EXIF orientation."""
from __future__ import annotations

import os
from typing import NamedTuple, Optional

import numpy as np
import torch
from .._library import _C
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


def jpeg_segments(buf):
    """The header segments of a JPEG, before its first scan: (marker, view of the buffer, offset of
    the segment's FF byte, its length field). Stops at the scan, the end of the image, or anything
    that is not a marker. (The frame header, read for every image, is read natively: jpeg_frame.)"""
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


class JpegFrame(NamedTuple):
    """What a JPEG's frame header says: the stored size, where the header is (offset of its FF
    byte), the height of a row of MCUs, and whether the rows can be cut short (see with_height)."""
    height: int
    width: int
    offset: int
    mcu_height: int
    rows_cuttable: bool


def jpeg_frame(buf) -> Optional[JpegFrame]:
    """The frame header of a JPEG (bytes or a 1-D uint8 array), or None when the buffer has none
    complete (not a JPEG, or cut before it). Read natively (jpeg_buffer.cpp): the loader's workers
    read one per image, and a Python walk through the markers took a quarter of a face worker's batch."""
    header = _C.jpeg_frame_header(buf)
    return None if header is None else JpegFrame(*header)


def inspect_jpeg(buf):
    """(why the buffer cannot be a complete JPEG or '', its frame header or None), from one reading of
    the header: what the loader's workers check of every encoded image."""
    problem, header = _C.jpeg_inspect(buf)
    return problem, (None if header is None else JpegFrame(*header))


def jpeg_size(buf):
    """(height, width) of the stored pixels from a JPEG's frame header, or None when the buffer has
    none (not a JPEG, or cut before it). DataLoader workers draw each sample's augmentation from it
    before the image is decoded."""
    frame = jpeg_frame(buf)
    return None if frame is None else (frame.height, frame.width)


def with_height(buf: np.ndarray, frame: JpegFrame, rows: int) -> None:
    """Writes `rows` (a multiple of the MCU height, below the stored height) into the frame header of
    `buf`, a writable copy of the JPEG: a decoder then stops after the MCU rows that cover `rows`,
    and the pixels of those rows are the whole image's (the later rows' coded data is never read).
    Only for frames with rows_cuttable."""
    if not frame.rows_cuttable or not 0 < rows < frame.height or rows % frame.mcu_height:
        raise ValueError(f"with_height: cannot cut a {frame.height}-row frame (MCU {frame.mcu_height}) to {rows} rows")
    buf[frame.offset + 5] = rows >> 8
    buf[frame.offset + 6] = rows & 0xFF
