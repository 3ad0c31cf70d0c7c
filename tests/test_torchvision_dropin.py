"""orbbec.nms / orbbec.roi_align where torchvision.ops users rely on them: autocast, empty inputs,
torch.fx, exception classes, numpy and quantized inputs. Compared with torchvision where it loads."""
import itertools

import numpy as np
import pytest
import torch
from torch import nn

import orbbec
import orbbec.roi_align as R
from conftest import DEVICES, torchvision_or_skip
from orbbec.common import ArgumentError, ArgumentTypeError
from orbbec.nms import batched_nms, nms, soft_nms
from orbbec.roi_align import RoIAlign, roi_align

HALF_TYPES = (torch.float16, torch.bfloat16, torch.float32)


def _features_and_rois(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 8, 20, 24, generator=g)
    xy = torch.rand(12, 2, generator=g) * torch.tensor([90.0, 70.0])
    wh = torch.rand(12, 2, generator=g) * 40 + 1
    rois = torch.cat([torch.arange(12).remainder(2).float()[:, None], xy, xy + wh], 1)
    return x.to(device), rois.to(device)


# ---------------------------------------------------------------- roi_align under autocast

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_dtype,box_dtype", list(itertools.product(HALF_TYPES, HALF_TYPES)))
def test_roi_align_autocast_computes_in_float32(device, x_dtype, box_dtype):
    x, rois = _features_and_rois(device)
    x, rois = x.to(x_dtype).requires_grad_(), rois.to(box_dtype)
    with torch.autocast(device, dtype=torch.float16 if device == "cuda" else torch.bfloat16):
        out = roi_align(x, rois, (5, 4), 0.25, 2, True)
    assert out.dtype == x_dtype
    # torchvision's autocast kernel: both operands in float32, the result cast to the input's dtype
    expected = roi_align(x.detach().float(), rois.float(), (5, 4), 0.25, 2, True).to(x_dtype)
    assert torch.equal(out.detach(), expected)
    out.float().sum().backward()
    assert x.grad.dtype == x_dtype and torch.isfinite(x.grad.float()).all() and x.grad.abs().sum() > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_dtype,box_dtype", [(torch.float16, torch.float32), (torch.bfloat16, torch.float32),
                                               (torch.float32, torch.float16), (torch.float16, torch.float16)])
def test_roi_align_autocast_matches_torchvision(device, x_dtype, box_dtype):
    tv_ops = torchvision_or_skip()
    x, rois = _features_and_rois(device, seed=1)
    x, rois = x.to(x_dtype), rois.to(box_dtype)
    with torch.autocast(device, dtype=torch.float16 if device == "cuda" else torch.bfloat16):
        ours = roi_align(x, rois, (5, 4), 0.25, 2, True)
        theirs = tv_ops.roi_align(x, rois, (5, 4), 0.25, 2, True)
    assert ours.dtype == theirs.dtype == x_dtype
    torch.testing.assert_close(ours, theirs)


def test_mixed_dtypes_outside_autocast_still_raise():
    x, rois = _features_and_rois("cpu")
    with pytest.raises(ArgumentTypeError, match="autocast"):
        roi_align(x.half(), rois, 2)


# ---------------------------------------------------------------- empty inputs

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(0,), (0, 4)])
def test_nms_and_batched_nms_take_any_empty_shape(device, shape):
    boxes = torch.empty(shape, device=device)
    scores, idxs = torch.empty(0, device=device), torch.empty(0, dtype=torch.int64, device=device)
    for keep in (nms(boxes, scores, 0.5), batched_nms(boxes, scores, idxs, 0.5), nms(boxes, 0.5)):
        assert keep.dtype == torch.int64 and keep.shape == (0,) and keep.device == boxes.device
    assert nms(torch.empty((0, 5), device=device), 0.5).shape == (0,)
    with pytest.raises(ArgumentError, match="iou_threshold"):
        nms(boxes, scores, float("nan"))  # still checked without boxes
    tv_ops = torchvision_or_skip()
    assert tv_ops.batched_nms(boxes, scores, idxs, 0.5).shape == (0,)  # torchvision's rule for batched_nms


# ---------------------------------------------------------------- torch.fx

class _Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = RoIAlign((3, 3), 0.5, 2, aligned=True)

    def forward(self, x, rois):
        # the module, the attribute form (patched by torch.fx.wrap) and a name imported here
        pooled = self.pool(x, rois).flatten(1) + R.roi_align(x, rois, 3, 0.5, 2, True).flatten(1)
        return pooled - roi_align(x, rois, 3, 0.5, 2, False).flatten(1)


def test_roi_align_is_traceable_by_fx():
    head = _Head()
    gm = torch.fx.symbolic_trace(head)
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is roi_align]
    assert len(calls) == 3
    x, rois = _features_and_rois("cpu")
    assert torch.equal(gm(x, rois), head(x, rois))


# ---------------------------------------------------------------- exception classes

def test_argument_errors_are_value_and_runtime_errors():
    assert issubclass(ArgumentError, ValueError) and issubclass(ArgumentError, RuntimeError)
    assert issubclass(ArgumentTypeError, TypeError) and issubclass(ArgumentTypeError, RuntimeError)
    assert orbbec.ArgumentError is ArgumentError and orbbec.ArgumentTypeError is ArgumentTypeError
    x, rois = _features_and_rois("cpu")
    boxes, scores = rois[:, 1:], torch.rand(12)
    bad_calls = [
        (lambda: nms(boxes[:, :3], scores, 0.5), ArgumentError),
        (lambda: nms(boxes.int(), scores, 0.5), ArgumentTypeError),
        (lambda: batched_nms(boxes, scores, scores, 0.5), ArgumentTypeError),
        (lambda: soft_nms(boxes, scores, method="hard"), ArgumentError),
        (lambda: roi_align(x[0], rois, 2), ArgumentError),
        (lambda: roi_align(x, rois, (2, 0)), ArgumentError),
        # raised by the C++ op, re-raised with the same message and the orbbec class
        (lambda: roi_align(x, torch.tensor([[5.0, 1, 1, 4, 4]]), 2), ArgumentError),
    ]
    for call, cls in bad_calls:
        with pytest.raises(RuntimeError) as info:  # as torchvision users catch them
            call()
        assert type(info.value) is cls and str(info.value).startswith("orbbec")
    with pytest.raises(ValueError, match="batch index"):
        roi_align(x, torch.tensor([[5.0, 1, 1, 4, 4]]), 2)


def test_torchvision_raises_runtime_error_where_orbbec_does():
    tv_ops = torchvision_or_skip()
    boxes, scores = _features_and_rois("cpu")[1][:, 1:], torch.rand(12)
    for ops in (tv_ops, orbbec.nms):
        with pytest.raises(RuntimeError):
            ops.nms(boxes[:, :3], scores, 0.5)
        with pytest.raises(RuntimeError):
            ops.nms(boxes, scores[:5], 0.5)


# ---------------------------------------------------------------- numpy and quantized inputs

def test_nms_refuses_numpy_and_says_so():
    boxes, scores = _features_and_rois("cpu")[1][:, 1:].numpy(), np.random.rand(12).astype(np.float32)
    for call in (lambda: nms(boxes, scores, 0.5), lambda: nms(torch.from_numpy(boxes), scores, 0.5),
                 lambda: nms(np.concatenate([boxes, scores[:, None]], 1), 0.5),
                 lambda: batched_nms(boxes, scores, np.zeros(12, np.int64), 0.5)):
        with pytest.raises(ArgumentTypeError, match="numpy arrays are not accepted"):
            call()
    assert nms(torch.from_numpy(boxes), torch.from_numpy(scores), 0.5).numel() > 0


@pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions")
def test_quantized_tensors_are_refused():
    x, rois = _features_and_rois("cpu")
    qx = torch.quantize_per_tensor(x, 0.1, 0, torch.quint8)
    with pytest.raises(ArgumentTypeError, match="quantized"):
        roi_align(qx, rois, 2)
    qb = torch.quantize_per_tensor(rois[:, 1:].contiguous(), 0.5, 0, torch.quint8)
    with pytest.raises(ArgumentTypeError, match="quantized"):
        nms(qb, torch.rand(12), 0.5)
