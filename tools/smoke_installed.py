#!/usr/bin/env python
"""Smoke test of an installed orbbec (a wheel or `pip install .`): run it from outside the checkout,
so that the installed package, not the source tree, is imported.

    cd /tmp && python /path/to/orbbec/tools/smoke_installed.py
"""
import argparse

argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

import torch  # noqa: E402

import orbbec  # noqa: E402
from orbbec.nms import batched_nms, nms  # noqa: E402
from orbbec.roi_align import RoIAlign, roi_align  # noqa: E402
from orbbec.warpaffine import warp_affine  # noqa: E402

assert "site-packages" in orbbec.__file__, f"not an installed orbbec: {orbbec.__file__}"
img = torch.randint(0, 256, (2, 3, 40, 50), dtype=torch.uint8)
M = torch.tensor([[0.9, -0.1, 3.0], [0.1, 0.9, -2.0]], dtype=torch.float64)
a, b = warp_affine(img, M, (32, 24)), warp_affine(img, M, size=(24, 32))
assert a.shape == (2, 3, 24, 32) and torch.equal(a, b)
boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 10, 10], [20, 20, 30, 30.0]])
scores = torch.tensor([0.9, 0.8, 0.7])
assert nms(boxes, scores, 0.5).tolist() == [0, 2]
assert batched_nms(boxes, scores, torch.tensor([0, 1, 0]), 0.5).tolist() == [0, 1, 2]
assert nms(torch.empty(0), torch.empty(0), 0.5).shape == (0,)
x = torch.randn(1, 4, 16, 16)
rois = torch.tensor([[0, 1.0, 1.0, 9.0, 9.0]])
with torch.autocast("cpu", dtype=torch.bfloat16):
    assert roi_align(x.half(), rois, 3, 1.0, 2, True).dtype == torch.float16
assert torch.fx.symbolic_trace(RoIAlign(3, 1.0, 2))(x, rois).shape == (1, 4, 3, 3)
try:
    nms(boxes[:, :3], scores, 0.5)
except RuntimeError as exc:
    assert isinstance(exc, ValueError) and isinstance(exc, orbbec.ArgumentError)
if torch.cuda.is_available() and orbbec.with_cuda():  # the installed CUDA kernels give the CPU's results
    assert torch.equal(warp_affine(img.cuda(), M.cuda(), (32, 24)).cpu(), a)
    assert nms(boxes.cuda(), scores.cuda(), 0.5).tolist() == [0, 2]
    torch.testing.assert_close(roi_align(x.cuda(), rois.cuda(), 3, 1.0, 2, True).cpu(), roi_align(x, rois, 3, 1.0, 2, True))
    try:
        import cv2
        import numpy as np
    except ImportError:
        cv2 = None
    if cv2 is not None:
        from orbbec.io import decode_jpeg
        y, x = np.mgrid[0:48, 0:64]
        pixels = np.stack([x * 4, y * 5, (x + y) * 2], -1).astype(np.uint8)  # smooth gradients
        jpeg = cv2.imencode(".jpg", pixels)[1].reshape(-1)
        on_gpu, on_cpu = decode_jpeg(jpeg, device="cuda"), decode_jpeg(jpeg, device="cpu")
        assert on_gpu.shape == on_cpu.shape == (48, 64, 3)
        diff = (on_gpu.cpu().float() - on_cpu.float()).abs()
        assert diff.mean() < 1.5, diff.mean()  # nvJPEG's and libjpeg-turbo's IDCT / upsampling differ slightly
    print("CUDA kernels OK on", torch.cuda.get_device_name())
print("smoke OK:", orbbec.__file__, "torch", torch.__version__, "| with_cuda", orbbec.with_cuda(),
      "|", orbbec.get_compiler_version())
