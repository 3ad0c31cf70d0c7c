"""warp_affine as a PyTorch op: autograd, opcheck, torch.compile, and errors on bad input."""
import numpy as np
import pytest
import torch

from conftest import DEVICES, requires_cuda, sample_photos
from orbbec.warpaffine import warp_affine
from warp_reference import random_matrix


def _small(device, dtype=torch.float64, seed=0):
    rng = np.random.default_rng(seed)
    photo = sample_photos((9, 11))
    src = torch.from_numpy(np.stack(photo[:2])).permute(0, 3, 1, 2).to(device=device, dtype=dtype) / 255.0
    inv = torch.from_numpy(np.stack([random_matrix(rng, (7, 8), (9, 11)) for _ in range(2)])).to(device)
    return src.contiguous(), inv


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interp", ["bilinear", "bicubic"])
@pytest.mark.parametrize("border", ["constant", "reflect101", "wrap"])
def test_gradcheck_image_and_matrix(device, interp, border):
    src, inv = _small(device)
    src.requires_grad_(True)
    inv.requires_grad_(True)

    def f(s, m):
        return warp_affine(s, m, (8, 7), interpolation=interp, border_mode=border, border_value=0.3, inverse_map=True)

    assert torch.autograd.gradcheck(f, (src, inv), eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_nearest_image_and_forward_matrix(device):
    src, inv = _small(device, seed=1)
    src.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda s: warp_affine(s, inv, (8, 7), interpolation="nearest", inverse_map=True), (src,))
    fwd = inv.clone().requires_grad_(True)  # through the float64 inversion as well
    assert torch.autograd.gradcheck(lambda m: warp_affine(src.detach(), m, (8, 7)), (fwd,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    src, inv = _small(device, dtype=torch.float32)
    for s, m in [(src, inv), (src.requires_grad_(True), inv.requires_grad_(True))]:
        torch.library.opcheck(torch.ops.orbbec.warp_affine.default, (s, m, 7, 8, 1, 0, [0.0]))
    u8 = (src.detach() * 255).to(torch.uint8)
    torch.library.opcheck(torch.ops.orbbec.warp_affine.default, (u8, inv.detach(), 7, 8, 2, 3, [1.0, 2.0, 3.0]),
                          test_utils=("test_schema", "test_faketensor"))
    cl = src.detach().contiguous(memory_format=torch.channels_last)
    torch.library.opcheck(torch.ops.orbbec.warp_affine.default, (cl, inv.detach(), 5, 6, 0, 4, [0.0]))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    src, inv = _small(device, dtype=torch.float32)
    u8 = (src * 255).to(torch.uint8)

    def pipeline(x, m):
        crops = warp_affine(x, m, (8, 7), border_mode="replicate", inverse_map=True)
        return (crops.float() / 255.0 - 0.5) / 0.25

    compiled = torch.compile(pipeline, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    torch.testing.assert_close(compiled(u8, inv), pipeline(u8, inv))


BAD_INPUTS = [
    ("wrong rank", lambda d: (torch.zeros(5, 5, dtype=torch.uint8, device=d), torch.eye(2, 3, device=d), (4, 4)), ValueError, "src"),
    ("matrix shape", lambda d: (torch.ones(2, 3, 5, 5, device=d), torch.ones(2, 3, 3, device=d), (4, 4)), ValueError, "M"),
    ("batch mismatch", lambda d: (torch.ones(2, 3, 5, 5, device=d), torch.ones(3, 2, 3, device=d), (4, 4)), ValueError, "M"),
    ("int matrix", lambda d: (torch.ones(1, 3, 5, 5, device=d), torch.ones(1, 2, 3, dtype=torch.int64, device=d), (4, 4)), TypeError, "M"),
    ("bad dtype", lambda d: (torch.ones(1, 3, 5, 5, dtype=torch.int32, device=d), torch.ones(1, 2, 3, device=d), (4, 4)), TypeError, "src"),
    ("zero size", lambda d: (torch.ones(1, 3, 5, 5, device=d), torch.ones(1, 2, 3, device=d), (0, 4)), ValueError, "dsize"),
    ("negative size", lambda d: (torch.ones(1, 3, 5, 5, device=d), torch.ones(1, 2, 3, device=d), (4, -2)), ValueError, "dsize"),
    ("empty image", lambda d: (torch.ones(1, 3, 0, 5, device=d), torch.ones(1, 2, 3, device=d), (4, 4)), ValueError, "src"),
    ("not a tensor", lambda d: (np.ones((1, 3, 5, 5), np.float32), torch.ones(1, 2, 3), (4, 4)), TypeError, "src"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_raises_naming_the_argument(device, case):
    _, make, exc, name = case
    src, M, dsize = make(device)
    with pytest.raises(exc, match=f"'{name}'"):
        warp_affine(src, M, dsize)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_modes_and_border_values(device):
    src = torch.ones(1, 3, 5, 5, device=device)
    M = torch.eye(2, 3, device=device)
    with pytest.raises(ValueError, match="'interpolation'"):
        warp_affine(src, M, (4, 4), interpolation="lanczos")
    with pytest.raises(ValueError, match="'border_mode'"):
        warp_affine(src, M, (4, 4), border_mode="mirror")
    with pytest.raises(ValueError, match="'border_value'"):
        warp_affine(src, M, (4, 4), border_value=(1, 2))


@pytest.mark.parametrize("device", DEVICES)
def test_native_checks_raise_python_errors(device):
    # The op called directly (bypassing the Python checks) still refuses bad input.
    src = torch.ones(2, 3, 5, 5, device=device)
    with pytest.raises(ValueError, match="'M'"):
        torch.ops.orbbec.warp_affine(src, torch.ones(1, 2, 3, device=device), 4, 4, 1, 0, [0.0])
    with pytest.raises(ValueError, match="output size"):
        torch.ops.orbbec.warp_affine(src, torch.ones(2, 2, 3, device=device), 0, 4, 1, 0, [0.0])
    with pytest.raises(ValueError, match="'interpolation'"):
        torch.ops.orbbec.warp_affine(src, torch.ones(2, 2, 3, device=device), 4, 4, 7, 0, [0.0])
    with pytest.raises(TypeError, match="'src'"):
        torch.ops.orbbec.warp_affine(src.int(), torch.ones(2, 2, 3, device=device), 4, 4, 1, 0, [0.0])


@requires_cuda
def test_matrix_on_another_device_raises():
    with pytest.raises(ValueError, match="'M'"):
        warp_affine(torch.ones(1, 3, 5, 5, device="cuda"), torch.ones(1, 2, 3), (4, 4))
    with pytest.raises(ValueError, match="'M'"):
        torch.ops.orbbec.warp_affine(torch.ones(1, 3, 5, 5, device="cuda"), torch.ones(1, 2, 3), 4, 4, 1, 0, [0.0])
