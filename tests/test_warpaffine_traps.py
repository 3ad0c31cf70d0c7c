"""The API traps of orbbec.warpaffine a new user falls into: (height, width) vs cv2's (width, height),
channels-last batches read as NCHW, list layouts, gradients through the fused path, bad faces."""
import numpy as np
import pytest
import torch

from conftest import DEVICES, sample_photos
from orbbec.common import ArgumentError
from orbbec.warpaffine import align_faces, arcface_template, warp_affine

# a rotation by 0.3 rad about (20, 15) and a shift: every pixel moves, no symmetry hides a mix-up
M = torch.tensor([[0.955, -0.296, 6.0], [0.296, 0.955, -4.0]], dtype=torch.float64)


def _batch(device, hw=(30, 40)):
    photos = sample_photos(hw)[:2]
    return torch.from_numpy(np.stack(photos)).permute(0, 3, 1, 2).contiguous().to(device)  # [2, 3, 30, 40]


@pytest.mark.parametrize("device", DEVICES)
def test_size_keyword_is_height_width(device):
    src = _batch(device)
    m = M.to(device)
    by_dsize = warp_affine(src, m, (24, 17))  # cv2: (width, height)
    by_size = warp_affine(src, m, size=(17, 24))  # torch / kornia: (height, width)
    assert by_size.shape == (2, 3, 17, 24) and torch.equal(by_size, by_dsize)
    assert warp_affine(src, m, size=20).shape == (2, 3, 20, 20)
    with pytest.raises(ArgumentError, match="not both"):
        warp_affine(src, m, (24, 17), size=(17, 24))
    with pytest.raises(ArgumentError, match="output size"):
        warp_affine(src, m)
    with pytest.raises(ArgumentError, match=r"'size' must be positive \(height, width\)"):
        warp_affine(src, m, size=(0, 24))


@pytest.mark.parametrize("device", DEVICES)
def test_channels_last_batch_is_not_read_as_nchw(device):
    nchw = _batch(device)
    nhwc = nchw.permute(0, 2, 3, 1).contiguous()  # [2, 30, 40, 3], as numpy / decoders give it
    m = M.to(device)
    with pytest.raises(ArgumentError, match="looks channels-last.*input_layout='NHWC'"):
        warp_affine(nhwc, m, (24, 17))
    with pytest.raises(ArgumentError, match="looks channels-last"):
        warp_affine(nhwc, m, (24, 17), out_dtype=torch.float32)
    with pytest.raises(ArgumentError, match="looks channels-last"):
        warp_affine(nhwc[0], m, (24, 17))
    expected = warp_affine(nchw, m, (24, 17))
    got = warp_affine(nhwc, m, (24, 17), input_layout="NHWC")
    assert got.shape == (2, 3, 17, 24) and torch.equal(got, expected)
    # a real 30-channel NCHW tensor of width 3 is taken when the layout is stated
    wide = torch.rand(2, 30, 10, 3, device=device)
    assert warp_affine(wide, m, (3, 10), input_layout="NCHW").shape == (2, 30, 10, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_list_layout_is_named_in_errors(device):
    chw = [_batch(device)[0], _batch(device, (26, 33))[1]]  # [3, H, W] images, default layout HWC
    m = M.to(device)
    with pytest.raises(ArgumentError, match="input_layout='HWC'.*pass input_layout='CHW'"):
        warp_affine(chw, m, (24, 17))
    wide = [torch.zeros(10, 12, 70, dtype=torch.uint8, device=device)]
    with pytest.raises(ArgumentError, match="input_layout='HWC'.*up to 64"):
        warp_affine(wide, m, (24, 17))
    out = warp_affine(chw, m, (24, 17), input_layout="CHW")
    assert torch.equal(out[0], warp_affine(chw[0], m, (24, 17)))


@pytest.mark.parametrize("device", DEVICES)
def test_fused_path_refuses_a_src_that_requires_grad(device):
    src = (_batch(device).float() / 255).requires_grad_()
    m = M.to(device)
    for kwargs in ({"out_dtype": torch.float16}, {"mean": [0.5, 0.5, 0.5]}, {"std": 2.0}, {"reverse_channels": True}):
        with pytest.raises(ArgumentError, match="not differentiable"):
            warp_affine(src, m, (24, 17), **kwargs)
    with pytest.raises(ArgumentError, match="not differentiable"):
        warp_affine([src[0].permute(1, 2, 0)], m, (24, 17))
    with torch.no_grad():
        fused = warp_affine(src, m, (24, 17), mean=[0.5, 0.5, 0.5])
    plain = warp_affine(src, m, (24, 17))  # the plain warp is differentiable
    plain.sum().backward()
    assert src.grad is not None and src.grad.abs().sum() > 0
    torch.testing.assert_close(fused, plain.detach() - 0.5)


@pytest.mark.parametrize("device", DEVICES)
def test_align_faces_bad_faces_get_the_border_and_spare_the_others(device):
    rng = np.random.default_rng(3)
    images = torch.from_numpy(np.stack(sample_photos((200, 180)))).permute(0, 3, 1, 2).contiguous().to(device)
    template = arcface_template(112).numpy()
    landmarks = torch.from_numpy(np.stack([(template - 56) * rng.uniform(1.1, 1.5) + rng.uniform(70, 110, 2)
                                           for _ in range(4)])).to(device)
    good = [0, 3]
    bad = landmarks.clone()
    bad[1, 2, 0] = float("nan")  # one non-finite coordinate
    bad[2] = bad[2, :1]  # all five points at one place: no scale
    out = align_faces(images, bad, size=112, border_value=7)
    alone = align_faces(images[good], landmarks[good], size=112, border_value=7)
    assert torch.equal(out[good], alone)
    assert (out[1] == 7).all() and (out[2] == 7).all()
    assert not (alone == 7).all()
    inf = bad.clone()
    inf[0, 0, 1] = float("inf")
    assert (align_faces(images, inf, size=112, border_value=7)[0] == 7).all()
