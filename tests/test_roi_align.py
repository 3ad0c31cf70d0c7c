"""orbbec.roi_align against an independent float64 reference (below), torchvision where it is
installed, and between devices and backward kernels.

Tolerances: float32 1e-5 relative (and absolute, for values near 0), float64 1e-10; float16 1e-3 and
bfloat16 1e-2 relative and absolute against the reference evaluated on the same rounded inputs (the
output rounding alone is up to 2^-11 and 2^-8 relative).
"""
import math

import numpy as np
import pytest
import torch

from conftest import DEVICES, requires_cuda, torchvision_or_skip
from orbbec.roi_align import RoIAlign, roi_align

TOL = {torch.float32: 1e-5, torch.float64: 1e-10, torch.float16: 1e-3, torch.bfloat16: 1e-2}


# ----------------------------------------------------------------------------------------------
# Reference: torchvision's definition, written out with Python loops (small sizes only). Box and
# sample coordinates are computed in `coord` (float32 for every dtype but float64, as the kernels
# do, so that the adaptive grid and the tap choice agree); interpolation and sums in float64.

def _bilinear(plane, y, x):
    C, H, W = plane.shape
    if y < -1.0 or y > H or x < -1.0 or x > W:
        return np.zeros(C)
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(y), int(x)
    if y0 >= H - 1:
        y0 = y1 = H - 1
        y = float(y0)
    else:
        y1 = y0 + 1
    if x0 >= W - 1:
        x0 = x1 = W - 1
        x = float(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - y0, x - x0
    hy, hx = 1.0 - ly, 1.0 - lx
    return (hy * hx * plane[:, y0, x0] + hy * lx * plane[:, y0, x1]
            + ly * hx * plane[:, y1, x0] + ly * lx * plane[:, y1, x1])


def reference(x, rois, output_size, scale, sampling_ratio, aligned, pool_mode="avg", coord=np.float32):
    feats = x.detach().cpu().double().numpy()
    rows = rois.detach().cpu().double().numpy()
    ph_n, pw_n = output_size
    f = coord
    out = np.zeros((len(rows), feats.shape[1], ph_n, pw_n))
    for k, r in enumerate(rows):
        off = f(0.5) if aligned else f(0.0)
        x1, y1, x2, y2 = (f(v) * f(scale) - off for v in r[1:])
        rw, rh = x2 - x1, y2 - y1
        if not aligned:
            rw, rh = max(rw, f(1.0)), max(rh, f(1.0))
        bh, bw = rh / f(ph_n), rw / f(pw_n)
        gh = sampling_ratio if sampling_ratio > 0 else int(math.ceil(bh))
        gw = sampling_ratio if sampling_ratio > 0 else int(math.ceil(bw))
        if gh <= 0 or gw <= 0:
            continue
        plane = feats[int(r[0])]
        for i in range(ph_n):
            for j in range(pw_n):
                vals = [_bilinear(plane, float(y1 + f(i) * bh + (f(iy) + f(0.5)) * bh / f(gh)),
                                  float(x1 + f(j) * bw + (f(ix) + f(0.5)) * bw / f(gw)))
                        for iy in range(gh) for ix in range(gw)]
                out[k, :, i, j] = np.mean(vals, axis=0) if pool_mode == "avg" else np.max(vals, axis=0)
    return torch.from_numpy(out)


# ----------------------------------------------------------------------------------------------
# Data: normal features; boxes partly outside the image, plus special ones.

def features(shape, dtype=torch.float32, device="cpu", seed=0, channels_last=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype).to(device)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def make_rois(n_img, map_hw, scale, count, dtype=torch.float32, device="cpu", seed=1, special=True):
    """Boxes in image coordinates ([0, map / scale)), 10% beyond every edge, up to 60% of the image;
    special=True appends a box wholly outside, a tiny one, an inverted one and one larger than the map."""
    g = torch.Generator().manual_seed(seed)
    ih, iw = map_hw[0] / scale, map_hw[1] / scale
    b = torch.randint(0, n_img, (count,), generator=g).double()
    x1 = (torch.rand(count, generator=g, dtype=torch.float64) * 1.2 - 0.1) * iw
    y1 = (torch.rand(count, generator=g, dtype=torch.float64) * 1.2 - 0.1) * ih
    w = torch.rand(count, generator=g, dtype=torch.float64) * 0.6 * iw
    h = torch.rand(count, generator=g, dtype=torch.float64) * 0.6 * ih
    rows = torch.stack([b, x1, y1, x1 + w, y1 + h], 1)
    if special:
        extra = torch.tensor([
            [0, iw + 3 / scale, ih * 0.2, iw + 9 / scale, ih * 0.6],   # wholly outside
            [n_img - 1, iw * 0.3, ih * 0.3, iw * 0.3 + 0.2, ih * 0.3 + 0.3],  # tiny
            [0, iw * 0.6, ih * 0.5, iw * 0.4, ih * 0.3],  # inverted (x2 < x1, y2 < y1)
            [n_img - 1, -0.3 * iw, -0.2 * ih, 1.3 * iw, 1.25 * ih],  # larger than the map
        ], dtype=torch.float64)
        rows = torch.cat([rows, extra])
    return rows.to(dtype).to(device)


def close(actual, expected, dtype):
    tol = TOL[dtype]
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), rtol=tol, atol=tol)


# ----------------------------------------------------------------------------------------------
# Forward against the reference

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [2, 0, -1, 3])
@pytest.mark.parametrize("pool_mode", ["avg", "max"])
def test_forward_matches_reference(device, dtype, aligned, sampling_ratio, pool_mode):
    x = features((2, 5, 9, 11), dtype, device)
    rois = make_rois(2, (9, 11), 0.5, 12, dtype, device)
    out = roi_align(x, rois, (3, 4), 0.5, sampling_ratio, aligned, pool_mode)
    assert out.shape == (rois.shape[0], 5, 3, 4) and out.dtype == dtype and out.device == x.device
    coord = np.float64 if dtype == torch.float64 else np.float32
    close(out, reference(x, rois, (3, 4), 0.5, sampling_ratio, aligned, pool_mode, coord), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("pool_mode", ["avg", "max"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_half_precision_matches_reference(device, dtype, pool_mode, channels_last):
    x = features((2, 16, 9, 11), dtype, device, channels_last=channels_last)
    rois = make_rois(2, (9, 11), 0.5, 12, dtype, device)
    out = roi_align(x, rois, 3, 0.5, 2, True, pool_mode)
    assert out.dtype == dtype
    close(out, reference(x, rois, (3, 3), 0.5, 2, True, pool_mode), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pool_mode", ["avg", "max"])
def test_channels_last_input(device, pool_mode):
    x = features((2, 8, 9, 11), device=device)
    rois = make_rois(2, (9, 11), 0.5, 10, device=device)
    xc = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    out = roi_align(xc, rois, (2, 3), 0.5, 2, True, pool_mode)
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    close(out, reference(x, rois, (2, 3), 0.5, 2, True, pool_mode), torch.float32)
    out.backward(torch.randn_like(out))
    assert xc.grad.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_input_and_rois(device):
    base = features((2, 6, 9, 22), device=device)
    x = base[:, :, :, ::2]  # strided view
    rois = make_rois(2, (9, 11), 0.5, 8, device=device)
    rois_nc = torch.cat([rois, rois], 1)[:, ::2]
    rois_nc.copy_(rois)
    assert not x.is_contiguous() and not rois_nc.is_contiguous()
    torch.testing.assert_close(roi_align(x, rois_nc, 3, 0.5, 2, True), roi_align(x.contiguous(), rois, 3, 0.5, 2, True),
                               rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_boxes_as_list(device):
    x = features((3, 4, 9, 11), device=device)
    per_image = [make_rois(1, (9, 11), 0.5, n, device=device, seed=n, special=False)[:, 1:] for n in (3, 0, 5)]
    rois = torch.cat([torch.cat([torch.full((len(b), 1), float(i), device=device), b], 1)
                      for i, b in enumerate(per_image)])
    expected = roi_align(x, rois, 2, 0.5, 2, True)
    torch.testing.assert_close(roi_align(x, per_image, 2, 0.5, 2, True), expected, rtol=0, atol=0)
    torch.testing.assert_close(roi_align(x, tuple(per_image), 2, 0.5, 2, True), expected, rtol=0, atol=0)
    assert roi_align(x, [], 2, 0.5, 2, True).shape == (0, 4, 2, 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pool_mode", ["avg", "max"])
def test_empty_rois(device, pool_mode):
    x = features((2, 4, 9, 11), device=device).requires_grad_()
    out = roi_align(x, torch.zeros((0, 5), device=device), (2, 3), 0.5, 2, True, pool_mode)
    assert out.shape == (0, 4, 2, 3)
    out.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pool_mode", ["avg", "max"])
def test_rois_wholly_outside_pool_zeros(device, pool_mode):
    x = features((1, 3, 8, 8), device=device).requires_grad_()
    rois = torch.tensor([[0, 20.0, 20.0, 30.0, 30.0], [0, -30.0, -30.0, -20.0, -2.5]], device=device)
    out = roi_align(x, rois, 2, 1.0, 2, False, pool_mode)
    assert torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("device", DEVICES)
def test_aligned_degenerate_rois(device):
    # aligned=True keeps a zero-size box at zero size: the adaptive grid is empty and pools 0;
    # a fixed grid samples the single point.
    x = features((1, 3, 8, 8), device=device)
    rois = torch.tensor([[0, 3.0, 3.0, 3.0, 3.0]], device=device)
    assert torch.equal(roi_align(x, rois, 2, 1.0, 0, True), torch.zeros(1, 3, 2, 2, device=device))
    close(roi_align(x, rois, 2, 1.0, 2, True), reference(x, rois, (2, 2), 1.0, 2, True), torch.float32)


def test_module():
    x = features((2, 4, 9, 11))
    rois = make_rois(2, (9, 11), 0.5, 6)
    m = RoIAlign((3, 2), 0.5, 2, aligned=True, pool_mode="max")
    assert "pool_mode='max'" in repr(m)
    torch.testing.assert_close(m(x, rois), roi_align(x, rois, (3, 2), 0.5, 2, True, "max"), rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------
# Gradients

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [2, 0])
@pytest.mark.parametrize("pool_mode", ["avg", "max"])
def test_gradcheck(device, aligned, sampling_ratio, pool_mode):
    x = features((2, 3, 6, 7), torch.float64, device).requires_grad_()
    rois = make_rois(2, (6, 7), 0.5, 5, torch.float64, device)
    # The default CUDA backward sums with atomics, in an order that may change between runs.
    nondet_tol = 1e-10 if device == "cuda" else 0.0
    assert torch.autograd.gradcheck(lambda t: roi_align(t, rois, (2, 3), 0.5, sampling_ratio, aligned, pool_mode),
                                    (x,), nondet_tol=nondet_tol)


@requires_cuda
@pytest.mark.parametrize("deterministic", [False, True])
def test_gradcheck_cuda_deterministic_kernels(deterministic):
    x = features((2, 3, 6, 7), torch.float64, "cuda").requires_grad_()
    rois = make_rois(2, (6, 7), 0.5, 5, torch.float64, "cuda")
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        for mode in ("avg", "max"):
            assert torch.autograd.gradcheck(lambda t: roi_align(t, rois, (2, 3), 0.5, 0, True, mode), (x,),
                                            nondet_tol=0.0 if deterministic else 1e-10)
    finally:
        torch.use_deterministic_algorithms(prev)


# ----------------------------------------------------------------------------------------------
# Bad inputs

def test_bad_batch_index_raises_on_cpu():
    x = features((2, 3, 8, 8))
    for b in (2.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="batch index"):
            roi_align(x, torch.tensor([[0, 1.0, 1.0, 4.0, 4.0], [b, 1.0, 1.0, 4.0, 4.0]]), 2)


@requires_cuda
@pytest.mark.parametrize("deterministic", [False, True])
def test_bad_batch_index_pools_zeros_on_cuda(deterministic):
    x = features((2, 3, 8, 8), device="cuda").requires_grad_()
    rois = torch.tensor([[0, 1.0, 1.0, 4.0, 4.0], [2.0, 1.0, 1.0, 4.0, 4.0], [-1.0, 1.0, 1.0, 4.0, 4.0],
                         [float("nan"), 1.0, 1.0, 4.0, 4.0], [1e30, 1.0, 1.0, 4.0, 4.0]], device="cuda")
    out = roi_align(x, rois, 2, 1.0, 2, True)
    assert torch.equal(out[1:], torch.zeros_like(out[1:]))
    close(out[:1], reference(x, rois[:1], (2, 2), 1.0, 2, True), torch.float32)
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        grad = torch.autograd.grad(out, x, torch.ones_like(out))[0]
        grad_first = torch.autograd.grad(roi_align(x, rois[:1], 2, 1.0, 2, True), x, torch.ones(1, 3, 2, 2,
                                                                                               device="cuda"))[0]
    finally:
        torch.use_deterministic_algorithms(prev)
    torch.testing.assert_close(grad, grad_first)


@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_coordinates_pool_zeros(device):
    x = features((1, 3, 8, 8), device=device)
    rois = torch.tensor([[0, float("nan"), 1.0, 4.0, 4.0], [0, 1.0, 1.0, float("inf"), 4.0]], device=device)
    for sr in (0, 2):
        out = roi_align(x, rois, 2, 1.0, sr, True)
        assert torch.equal(out, torch.zeros_like(out))


def test_bad_arguments():
    x = features((2, 3, 8, 8))
    rois = make_rois(2, (8, 8), 1.0, 4)
    with pytest.raises(ValueError, match="'input'"):
        roi_align(x[0], rois, 2)
    with pytest.raises(TypeError, match="'input'"):
        roi_align(x.to(torch.int32), rois.to(torch.int32), 2)
    with pytest.raises(ValueError, match=r"\[K, 5\]"):
        roi_align(x, rois[:, :4], 2)
    with pytest.raises(ValueError, match=r"\[L, 4\]"):
        roi_align(x, [rois[:, :3]], 2)
    with pytest.raises(TypeError, match="dtype"):
        roi_align(x, rois.double(), 2)
    with pytest.raises(ValueError, match="output_size"):
        roi_align(x, rois, -2)
    with pytest.raises(ValueError, match="output_size"):
        roi_align(x, rois, (2, 0))
    with pytest.raises(ValueError, match="output_size"):
        roi_align(x, rois, (2, 2, 2))
    with pytest.raises(ValueError, match="pool_mode"):
        roi_align(x, rois, 2, pool_mode="min")
    with pytest.raises(ValueError, match="pool_mode"):
        RoIAlign(2, 1.0, 2, pool_mode="sum")
    with pytest.raises(ValueError, match="sampling_ratio"):
        roi_align(x, rois, 2, sampling_ratio=1 << 20)
    with pytest.raises(ValueError, match="height and width"):
        roi_align(torch.zeros(1, 3, 0, 5), torch.zeros(0, 5), 2)
    # The op itself checks too (for callers of torch.ops.orbbec.roi_align).
    op = torch.ops.orbbec.roi_align
    with pytest.raises(ValueError, match="output_size"):
        op(x, rois, 1.0, -1, 2, 2, True, 0)
    with pytest.raises(ValueError, match="pool_mode"):
        op(x, rois, 1.0, 2, 2, 2, True, 5)
    with pytest.raises(TypeError, match="dtype"):
        op(x, rois.double(), 1.0, 2, 2, 2, True, 0)
    with pytest.raises(ValueError, match=r"\[K, 5\]"):
        op(x, rois[:, :4], 1.0, 2, 2, 2, True, 0)
    with pytest.raises(ValueError, match="grad"):
        torch.ops.orbbec.roi_align_backward(torch.zeros(4, 3, 3, 3), rois, x, 1.0, 2, 2, 2, True, 0, False)


@requires_cuda
def test_rois_on_another_device():
    x = features((2, 3, 8, 8), device="cuda")
    rois = make_rois(2, (8, 8), 1.0, 4)
    with pytest.raises(ValueError, match="device"):
        roi_align(x, rois, 2)
    with pytest.raises(ValueError, match="device"):
        torch.ops.orbbec.roi_align(x, rois, 1.0, 2, 2, 2, True, 0)
    with pytest.raises(ValueError, match="device"):
        roi_align(x, [rois[:2, 1:], rois[2:, 1:].cuda()], 2)


# ----------------------------------------------------------------------------------------------
# CUDA against CPU, and the deterministic backward

def _forward_backward(x, rois, grad_out, *args):
    x = x.detach().requires_grad_()
    out = roi_align(x, rois, *args)
    (gx,) = torch.autograd.grad(out, x, grad_out)
    return out, gx


# (map shape, roi count, output size, sampling ratio): fixed grids, and adaptive ones with few rois,
# pool straight from NCHW; many rois with adaptive grids convert it to channels_last; C % 4 != 0
# uses scalar loads; large grids take the kernels' untabulated paths and several rounds of the
# deterministic kernel's lists. Fixed grids of 1, 2 and 4 samples a side take the NCHW kernel with
# one lane per sample column (partial channel chunks: C = 20 and 12), 3 the shared-table one.
CUDA_CASES = [
    ((2, 16, 40, 48), 3, (3, 4), 2),
    ((2, 16, 12, 14), 150, (7, 7), 2),
    ((2, 20, 16, 18), 30, (5, 3), 4),
    ((1, 12, 10, 12), 20, (2, 5), 1),
    ((2, 6, 12, 14), 150, (3, 3), 0),
    ((1, 130, 20, 22), 40, (2, 3), 0),
    ((1, 8, 150, 140), 4, (2, 2), 0),
    ((1, 8, 30, 40), 4, (3, 8), 70),
]


@requires_cuda
@pytest.mark.parametrize("case", CUDA_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("pool_mode", ["avg", "max"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_cuda_matches_cpu(case, dtype, pool_mode, channels_last):
    shape, count, size, sr = case
    x = features(shape, dtype, channels_last=channels_last)
    rois = make_rois(shape[0], shape[2:], 0.5, count, dtype)
    g = torch.Generator().manual_seed(3)
    grad_out = torch.randn((rois.shape[0], shape[1]) + size, generator=g, dtype=torch.float64).to(dtype)
    out_cpu, gx_cpu = _forward_backward(x, rois, grad_out, size, 0.5, sr, True, pool_mode)
    tol = 1e-5 if dtype == torch.float32 else TOL[dtype]
    for deterministic in (False, True):
        prev = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(deterministic)
        try:
            out, gx = _forward_backward(x.cuda(), rois.cuda(), grad_out.cuda(), size, 0.5, sr, True, pool_mode)
        finally:
            torch.use_deterministic_algorithms(prev)
        assert out.is_contiguous(memory_format=torch.channels_last) == out_cpu.is_contiguous(
            memory_format=torch.channels_last)
        assert gx.stride() == gx_cpu.stride()
        torch.testing.assert_close(out.cpu(), out_cpu, rtol=tol, atol=tol)
        # Gradients sum many terms (sampling_ratio 70: thousands per pixel) in an order the CUDA
        # atomics do not fix, so the absolute tolerance scales with the largest gradient;
        # half-precision ones are rounded once, at the end.
        scale = max(1.0, gx_cpu.double().abs().max().item())
        torch.testing.assert_close(gx.cpu().double(), gx_cpu.double(), rtol=tol, atol=tol * 10 * scale)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("pool_mode", ["avg", "max"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_deterministic_backward_is_bitwise_reproducible(dtype, pool_mode, channels_last):
    # Many rois on a small map: every pixel's gradient sums contributions of many rois.
    x = features((2, 64, 24, 28), dtype, "cuda", channels_last=channels_last)
    rois = make_rois(2, (24, 28), 0.25, 600, dtype, "cuda")
    grad_out = torch.randn((rois.shape[0], 64, 7, 7), device="cuda").to(dtype)
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        grads = [_forward_backward(x, rois, grad_out, 7, 0.25, 0, True, pool_mode)[1] for _ in range(4)]
    finally:
        torch.use_deterministic_algorithms(prev)
    for gx in grads[1:]:
        assert torch.equal(gx, grads[0])
    atomic = _forward_backward(x, rois, grad_out, 7, 0.25, 0, True, pool_mode)[1]
    torch.testing.assert_close(atomic.double(), grads[0].double(), rtol=TOL[dtype], atol=TOL[dtype] * 10)


# ----------------------------------------------------------------------------------------------
# torch.library integration

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pool_mode", [0, 1])
@pytest.mark.parametrize("channels_last", [False, True])
def test_opcheck(device, pool_mode, channels_last):
    x = features((2, 4, 9, 11), device=device, channels_last=channels_last).requires_grad_()
    rois = make_rois(2, (9, 11), 0.5, 6, device=device)
    torch.library.opcheck(torch.ops.orbbec.roi_align.default, (x, rois, 0.5, 3, 2, 2, True, pool_mode))
    grad = torch.randn(rois.shape[0], 4, 3, 2, device=device)
    torch.library.opcheck(torch.ops.orbbec.roi_align_backward.default,
                          (grad, rois, x.detach(), 0.5, 3, 2, 2, True, pool_mode, False))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    def pool(x, rois):
        return roi_align(x, rois, (3, 3), 0.5, 2, True).relu().sum(dim=(2, 3))

    x = features((2, 4, 9, 11), device=device)
    rois = make_rois(2, (9, 11), 0.5, 6, device=device)
    compiled = torch.compile(pool, fullgraph=True)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_e, out_c = pool(xe, rois), compiled(xc, rois)
    torch.testing.assert_close(out_c, out_e)
    out_e.sum().backward()
    out_c.sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad)


# ----------------------------------------------------------------------------------------------
# torchvision (not installed on every machine)

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [2, 0])
def test_matches_torchvision(device, dtype, aligned, sampling_ratio):
    tv_ops = torchvision_or_skip()
    x = features((2, 16, 20, 24), dtype, device)
    rois = make_rois(2, (20, 24), 0.25, 40, dtype, device)
    g = torch.randn(rois.shape[0], 16, 5, 4, dtype=dtype, device=device)
    out, gx = _forward_backward(x, rois, g, (5, 4), 0.25, sampling_ratio, aligned)
    xt = x.detach().requires_grad_()
    out_tv = tv_ops.roi_align(xt, rois, (5, 4), 0.25, sampling_ratio, aligned)
    (gx_tv,) = torch.autograd.grad(out_tv, xt, g)
    close(out, out_tv, dtype)
    close(gx, gx_tv, dtype)
