"""Decoding only the rows of each JPEG that its warp reads.

A sequential JPEG is coded one row of MCUs after another from the top, so a decoder told by the frame
header that the image ends lower down never decodes the rest: the entropy decoding, which is most of a
large JPEG's decoding time, stops there. The rows above the region still have to be decoded (the code
of a row follows from the rows before it), so only the part below the warp's lowest source row is
saved: with RandomResizedCrop's defaults on 1920x1080 photographs, 12% of the rows on average.

The warp's output pixels are the same as with the whole image: the kept rows reach past the lowest row
the warp can read (its source rows for every output pixel, plus the interpolation's reach) by the rows
that chroma upsampling looks at below, and the decoder's pixels of a kept row do not depend on the rows
after them beyond that.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from ..io._buffers import JpegFrame

# Rows kept below the lowest row a warp sample falls in: the interpolation reads up to 4 rows on
# (Lanczos4; bicubic 2, bilinear 1) and a 2x vertically subsampled chroma plane is upsampled from
# the chroma row below (the decoder's last row of 4:2:0 differs when it is the image's last).
ROWS_PAST_THE_WARP = 4 + 2


def rows_to_decode(matrices: np.ndarray, out_size, frames: Sequence[Optional[JpegFrame]]) -> List[Optional[int]]:
    """For each sample, the height to write into its JPEG's frame header, or None to decode it whole.
    matrices: [B, 2, 3] forward (input pixel -> output pixel); out_size: the output (height, width)."""
    m = np.asarray(matrices, dtype=np.float64).reshape(-1, 2, 3)
    a, b, tx = m[:, 0, 0], m[:, 0, 1], m[:, 0, 2]
    c, d, ty = m[:, 1, 0], m[:, 1, 1], m[:, 1, 2]
    det = a * d - b * c
    oh, ow = out_size
    # The source row of output pixel (x, y) is (-c (x - tx) + a (y - ty)) / det: affine, so its
    # largest value over the output lies at a corner.
    corners = np.array([[0.0, 0.0], [ow - 1.0, 0.0], [0.0, oh - 1.0], [ow - 1.0, oh - 1.0]])
    with np.errstate(divide="ignore", invalid="ignore"):
        ys = (-c[:, None] * (corners[None, :, 0] - tx[:, None]) + a[:, None] * (corners[None, :, 1] - ty[:, None])) \
            / det[:, None]
    lowest = ys.max(axis=1)
    # Per sample only what its frame says; the arithmetic for the batch at once.
    cuttable = np.array([f is not None and f.rows_cuttable for f in frames], bool) & np.isfinite(lowest)
    mcu = np.array([8 if f is None else f.mcu_height for f in frames], np.int64)
    height = np.array([0 if f is None else f.height for f in frames], np.int64)
    # (held to the frame's height first: a row past it keeps the whole image, and stays an int64)
    lowest = np.clip(np.where(cuttable, lowest, 0.0), 0.0, height)
    need = np.floor(lowest).astype(np.int64) + ROWS_PAST_THE_WARP + 1
    rows = -(-need // mcu) * mcu
    return [r if c and r < h else None for r, c, h in zip(rows.tolist(), cuttable.tolist(), height.tolist())]
