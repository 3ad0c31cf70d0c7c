"""affine_opencv: a numpy uint8 image warped by OpenCV's C++ library, through pybind11 (optional build)."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
from ..common import ArgumentError, ArgumentTypeError

try:
    from . import _opencv as _native
    _WHY = ""
except ImportError as exc:  # built without OpenCV's C++ headers, or its libraries missing here
    _native = None
    _WHY = f" ({exc})" if ".so" in str(exc) else ""  # a library the loader could not find

_HOW_TO_GET = (
    "orbbec's affine_opencv is not available: orbbec was built without OpenCV's C++ library, or "
    "that library is missing on this machine" + _WHY + ". Install it "
    "(Debian/Ubuntu: `apt-get install libopencv-dev`) and rebuild orbbec "
    "(`pip install --no-build-isolation -e .`); warp_affine does the same on tensors without it."
)


def affine_opencv(img: np.ndarray, src_points, dst_points, dsize: Optional[Tuple[int, int]] = None) -> np.ndarray:
    """cv2.getAffineTransform(src_points, dst_points) then cv2.warpAffine (bilinear, constant 0
    border) in OpenCV's C++ library. img: uint8 HxW or HxWx3 numpy array; 3 point pairs [3, 2];
    dsize (width, height), default the input's size."""
    if _native is None:
        raise ImportError(_HOW_TO_GET)
    if not isinstance(img, np.ndarray) or img.dtype != np.uint8:
        raise ArgumentTypeError("orbbec: 'img' must be a numpy uint8 array")
    if img.ndim not in (2, 3) or (img.ndim == 3 and img.shape[2] not in (1, 3)):
        raise ArgumentError(f"orbbec: 'img' must be HxW or HxWx1/3, got shape {img.shape}")
    src = np.asarray(src_points, dtype=np.float32)
    dst = np.asarray(dst_points, dtype=np.float32)
    if src.shape != (3, 2) or dst.shape != (3, 2):
        raise ArgumentError(f"orbbec: 'src_points' and 'dst_points' must have shape (3, 2), got {src.shape} and {dst.shape}")
    if dsize is None:
        dsize = (img.shape[1], img.shape[0])
    w, h = (int(v) for v in dsize)
    if w <= 0 or h <= 0:
        raise ArgumentError(f"orbbec: 'dsize' must be positive (width, height), got {dsize!r}")
    return _native.affine_opencv(np.ascontiguousarray(img), src, dst, w, h)
