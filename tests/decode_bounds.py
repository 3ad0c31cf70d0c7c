"""The GPU decoder's bounds against cv2 (libjpeg-turbo), shared by the decode tests."""
import numpy as np
import pytest
import torch

from conftest import HAS_CUDA

import orbbec.io as oio

HAS_NVJPEG = HAS_CUDA and oio._C.with_nvjpeg
requires_nvjpeg = pytest.mark.skipif(not HAS_NVJPEG, reason="CUDA test: no CUDA device (or orbbec built without nvJPEG)")

# GPU against cv2 (libjpeg-turbo): nvJPEG's IDCT and chroma upsampling differ from libjpeg-turbo's
# integer IDCT and 'fancy' upsampling, so pixels differ by a few levels, most at sharp colour edges.
# Bounds from the differences measured on the H100 (docs/io.md), with margin.
# Small images have relatively more pixels at colour edges, where the chroma upsampling differs.
GPU_MEAN_BOUND = 1.5
GPU_MEAN_BOUND_SMALL = 4.0  # images under 200 x 200
GPU_P999_BOUND = 24


def diff_to_cv2(a: torch.Tensor, b: np.ndarray):
    d = np.abs(a.cpu().numpy().astype(np.int16) - b.astype(np.int16))
    return float(d.mean()), float(np.quantile(d, 0.999)), int(d.max())


def close_to_cv2(a: torch.Tensor, b: np.ndarray) -> bool:
    bound = GPU_MEAN_BOUND if b.shape[0] * b.shape[1] >= 200 * 200 else GPU_MEAN_BOUND_SMALL
    return a.device.type == "cuda" and a.shape == b.shape and diff_to_cv2(a, b)[0] < bound

