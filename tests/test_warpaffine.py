"""warp_affine / affine_torch against cv2.warpAffine and a float64 reference, on CPU and CUDA."""
import zlib

import cv2
import numpy as np
import pytest
import torch

from conftest import DEVICES, requires_cuda, sample_photos
from orbbec.warpaffine import affine_torch, invert_affine, warp_affine
from warp_reference import CV2_BORDER, CV2_INTERP, random_matrix, warp_reference

INTERPS = ["nearest", "bilinear", "bicubic"]
BORDERS = list(CV2_BORDER)
# (input h, w), (output h, w): downscaling, upscaling, odd sizes
SIZES = [((250, 250), (112, 112)), ((97, 131), (160, 143)), ((320, 240), (61, 77))]


def _batch(seed, in_hw, out_hw, n=6):
    rng = np.random.default_rng(seed)
    photos = sample_photos(in_hw)
    imgs = [photos[i % 4] for i in range(n)]
    mats = np.stack([random_matrix(rng, in_hw, out_hw) for _ in range(n)])
    return imgs, mats


def _to_nchw(imgs, device):
    return torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).contiguous().to(device)


def _cpu_batch_in(imgs, in_layout):
    src = _to_nchw(imgs, "cpu")
    return src.contiguous(memory_format=torch.channels_last) if in_layout == "NHWC" else src


def _cv2_batch(imgs, mats, out_hw, interp, border, border_value=(0, 0, 0)):
    oh, ow = out_hw
    return np.stack([
        cv2.warpAffine(im, m, (ow, oh), flags=CV2_INTERP[interp], borderMode=CV2_BORDER[border],
                       borderValue=border_value)
        for im, m in zip(imgs, mats)
    ])


def _source_coords(mats, out_hw):
    """Exact (float64) source coordinates of every output pixel, [B, OH, OW] each."""
    ys, xs = np.mgrid[0:out_hw[0], 0:out_hw[1]].astype(np.float64)
    inv = np.stack([cv2.invertAffineTransform(m) for m in mats])[:, :, :, None, None]
    return (inv[:, 0, 0] * xs + inv[:, 0, 1] * ys + inv[:, 0, 2], inv[:, 1, 0] * xs + inv[:, 1, 1] * ys + inv[:, 1, 2])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interp", INTERPS)
@pytest.mark.parametrize("border", BORDERS)
@pytest.mark.parametrize("sizes", SIZES)
def test_uint8_matches_cv2(device, interp, border, sizes):
    in_hw, out_hw = sizes
    imgs, mats = _batch(zlib.crc32(repr((interp, border, sizes)).encode()), in_hw, out_hw, n=12)
    bval = (17, 130, 250)
    out = warp_affine(_to_nchw(imgs, device), torch.from_numpy(mats).to(device), out_hw[::-1],
                      interpolation=interp, border_mode=border, border_value=bval)
    out = out.permute(0, 2, 3, 1).cpu().numpy()
    ref = _cv2_batch(imgs, mats, out_hw, interp, border, bval)
    values_identical = (out == ref).mean()
    diff = np.abs(out.astype(np.int16) - ref).max(-1)  # per pixel (all channels)
    identical = (diff == 0).mean()
    if interp == "bilinear":
        # OpenCV 5's float32 arithmetic, reproduced; a source coordinate whose float32 rounding
        # differs by an ulp from cv2's vector code can move a value across .5: 1 level, on about 4
        # values (1 to 1.5 pixels) in 100,000 with these matrices.
        assert diff.max() <= 1 and values_identical >= 0.9999 and identical >= 0.9997, (diff.max(), identical)
        return
    sx, sy = _source_coords(mats, out_hw)
    if interp == "nearest":
        # The same float32 coordinates; where the exact coordinate is within float32 rounding of a
        # .5 tie, cv2 and orbbec may pick neighbouring pixels (any difference there), else equal.
        at_tie = (np.abs(np.abs(sx - np.floor(sx)) - 0.5) < 1e-4) | (np.abs(np.abs(sy - np.floor(sy)) - 0.5) < 1e-4)
        assert diff[~at_tie].max() <= 1 and identical >= 0.999, (diff[~at_tie].max(), identical)
        return
    # Bicubic: sums 16 taps in another order than cv2, so up to 1 level on 1 pixel in 1,000. For
    # reflect/wrap taps far beyond the edge cv2's bicubic differs from the definition (its own
    # reflect101/wrap of each tap, as the float64 reference computes it): checked against that.
    inside = (sx >= 1) & (sx < in_hw[1] - 2) & (sy >= 1) & (sy < in_hw[0] - 2)
    near_cv2 = inside | (border in ("constant", "replicate"))
    assert diff[near_cv2].max() <= 1 and (diff[near_cv2] == 0).mean() >= 0.999
    for i in range(len(imgs)):
        far = ~near_cv2[i]
        if far.any():
            exact = warp_reference(imgs[i], cv2.invertAffineTransform(mats[i]), out_hw, "bicubic", border)
            exact = np.clip(np.rint(exact), 0, 255)
            assert np.abs(out[i][far].astype(np.int16) - exact[far]).max() <= 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interp", ["bilinear", "bicubic"])
@pytest.mark.parametrize("border", BORDERS)
def test_float_matches_float64_reference(device, interp, border):
    in_hw, out_hw = (131, 97), (88, 120)
    imgs, mats = _batch(7, in_hw, out_hw, n=3)
    src = _to_nchw(imgs, device).float() / 255.0
    out = warp_affine(src, torch.from_numpy(mats).to(device), out_hw[::-1], interpolation=interp,
                      border_mode=border, border_value=0.25)
    for i, m in enumerate(mats):
        ref = warp_reference(imgs[i] / 255.0, cv2.invertAffineTransform(m), out_hw, interp, border, 0.25)
        got = out[i].permute(1, 2, 0).double().cpu().numpy()
        rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert rel < 1e-5, (interp, border, rel)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interp", INTERPS)
def test_float64_is_exact_to_reference(device, interp):
    imgs, mats = _batch(11, (60, 70), (50, 40), n=2)
    src = _to_nchw(imgs, device).double()
    out = warp_affine(src, torch.from_numpy(mats).to(device), (40, 50), interpolation=interp, border_mode="reflect101")
    for i, m in enumerate(mats):
        inv = invert_affine(torch.from_numpy(m)).numpy()
        ref = warp_reference(imgs[i], inv, (50, 40), interp, "reflect101")
        np.testing.assert_allclose(out[i].permute(1, 2, 0).cpu().numpy(), ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_half_types_follow_float32(device, dtype, tol):
    imgs, mats = _batch(3, (80, 90), (64, 64), n=3)
    src = _to_nchw(imgs, device).float() / 255.0
    M = torch.from_numpy(mats).to(device)
    full = warp_affine(src, M, (64, 64))
    half = warp_affine(src.to(dtype), M, (64, 64))
    assert half.dtype == dtype
    assert (half.float() - full).abs().max().item() <= tol * 2  # one rounding of the input, one of the output


@pytest.mark.parametrize("device", DEVICES)
def test_per_image_matrices_are_honoured(device):
    imgs, mats = _batch(5, (120, 100), (70, 90), n=5)
    batch = warp_affine(_to_nchw(imgs, device), torch.from_numpy(mats).to(device), (90, 70))
    for i in range(len(imgs)):
        single = warp_affine(_to_nchw(imgs[i:i + 1], device), torch.from_numpy(mats[i]).to(device), (90, 70))
        assert torch.equal(batch[i:i + 1], single)
    assert not torch.equal(batch[0], batch[1])


@pytest.mark.parametrize("device", DEVICES)
def test_shared_matrix_and_unbatched_input(device):
    imgs, mats = _batch(9, (64, 64), (32, 48), n=3)
    src = _to_nchw(imgs, device)
    M = torch.from_numpy(mats[0]).to(device)
    shared = warp_affine(src, M, (48, 32))
    per_image = warp_affine(src, M.expand(3, 2, 3), (48, 32))
    assert torch.equal(shared, per_image)
    assert torch.equal(warp_affine(src[1], M, (48, 32)), shared[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interp", INTERPS)
def test_layouts_give_the_same_result(device, interp):
    imgs, mats = _batch(13, (90, 110), (64, 80), n=4)
    src = _to_nchw(imgs, device)
    M = torch.from_numpy(mats).to(device)
    ref = warp_affine(src, M, (80, 64), interpolation=interp, border_mode="reflect")
    channels_last = src.contiguous(memory_format=torch.channels_last)
    out_cl = warp_affine(channels_last, M, (80, 64), interpolation=interp, border_mode="reflect")
    assert out_cl.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out_cl, ref)
    # strided views: every other image, a channel subset, a horizontal crop
    wide = torch.cat([src, src.flip(-1)], dim=-1)[:, :, :, : src.shape[-1]]
    assert not wide.is_contiguous()
    assert torch.equal(warp_affine(wide, M, (80, 64), interpolation=interp, border_mode="reflect"), ref)
    bgr = src.flip(1)
    assert torch.equal(warp_affine(bgr, M, (80, 64), interpolation=interp, border_mode="reflect"), ref.flip(1))


@pytest.mark.parametrize("device", DEVICES)
def test_any_channel_count(device):
    rng = np.random.default_rng(2)
    photo = sample_photos((70, 80))[1]
    stack = np.concatenate([photo, photo[:, ::-1], photo[::-1]], axis=2)[:, :, :7]  # 7 channels
    mats = np.stack([random_matrix(rng, (70, 80), (50, 60)) for _ in range(2)])
    src = torch.from_numpy(np.stack([stack, stack[::-1].copy()])).permute(0, 3, 1, 2).contiguous().to(device)
    out = warp_affine(src, torch.from_numpy(mats).to(device), (60, 50), border_value=list(range(7)))
    for c in range(7):
        one = warp_affine(src[:, c:c + 1], torch.from_numpy(mats).to(device), (60, 50), border_value=c)
        assert torch.equal(out[:, c:c + 1], one)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offset", [1, 2, 3])
def test_unaligned_hwc_images(device, offset):
    # HWC images that start at any byte (views into a larger buffer): the CUDA 3-channel kernel
    # reads tap rows as aligned 32-bit words.
    imgs, mats = _batch(23, (61, 77), (40, 52), n=3)
    flat = torch.from_numpy(np.concatenate([np.zeros(offset, np.uint8), np.stack(imgs).ravel(), np.zeros(5, np.uint8)]))
    view = flat.to(device)[offset:offset + np.stack(imgs).size].view(3, 61, 77, 3)
    assert view.storage_offset() == offset
    M = torch.from_numpy(mats).to(device)
    for border in ("constant", "reflect101"):
        ref = _cv2_batch(imgs, mats, (40, 52), "bilinear", border)
        out = warp_affine(view.permute(0, 3, 1, 2), M, (52, 40), border_mode=border)
        assert np.array_equal(out.permute(0, 2, 3, 1).cpu().numpy(), warp_affine(
            _to_nchw(imgs, device).contiguous(memory_format=torch.channels_last), M, (52, 40),
            border_mode=border).permute(0, 2, 3, 1).cpu().numpy())
        assert np.abs(out.permute(0, 2, 3, 1).cpu().numpy().astype(int) - ref).max() <= 1
        listed = warp_affine([view[i] for i in range(3)], M, (52, 40), border_mode=border)
        assert torch.equal(listed, out.contiguous())


@requires_cuda
@pytest.mark.parametrize("out_hw", [(64, 128), (45, 131), (33, 64), (97, 200), (112, 112), (30, 70), (5, 3)])
@pytest.mark.parametrize("in_layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("border", ["constant", "replicate"])
def test_cuda_output_tiles_of_every_shape(out_hw, in_layout, border):
    # The CUDA 3-channel kernel writes its outputs through a stage in shared memory, as whole
    # words where a tile's rows are word-aligned and a whole number of words (full tiles, and
    # partial ones such as face's 112 columns in a 128-column tile), value by value elsewhere (odd
    # widths): each shape here takes a different mix. uint8 and float32 against the CPU bit for
    # bit; float16 / bfloat16 against the float32 output.
    oh, ow = out_hw
    imgs, mats = _batch(29, (150, 170), out_hw, n=3)
    src = _cpu_batch_in(imgs, in_layout)
    M = torch.from_numpy(mats)
    kw = dict(border_mode=border, border_value=(9, 99, 199))
    for out_layout in ("NCHW", "NHWC"):
        fmt = torch.channels_last if out_layout == "NHWC" else torch.contiguous_format
        cpu = warp_affine(src, M, (ow, oh), **kw).contiguous(memory_format=fmt)
        cuda = warp_affine(src.cuda(), M.cuda(), (ow, oh), out_dtype=torch.uint8, out_layout=out_layout, **kw)
        assert cuda.is_contiguous(memory_format=fmt) and torch.equal(cuda.cpu(), cpu)
        norm = dict(mean=[100.0, 110.0, 120.0], std=[50.0, 55.0, 60.0], out_layout=out_layout, **kw)
        ref = warp_affine(src.cuda(), M.cuda(), (ow, oh), out_dtype=torch.float32, **norm)
        assert torch.equal(ref.cpu(), warp_affine(src, M, (ow, oh), out_dtype=torch.float32, **norm))
        for dtype in (torch.float16, torch.bfloat16):
            assert torch.equal(warp_affine(src.cuda(), M.cuda(), (ow, oh), out_dtype=dtype, **norm), ref.to(dtype))


@requires_cuda
@pytest.mark.parametrize("in_layout", ["NCHW", "NHWC"])
def test_cuda_sheared_lanes_at_every_angle(in_layout):
    # The 3-channel kernel shears its lanes down the tile's rows by round(t * lane) mod 16, t the
    # slope of a source row in the output (capped at 1, none when it is not finite): every angle
    # must still write each pixel once, as the CPU does. Angles cover both signs of t, |t| < 1,
    # |t| = 1, |t| > 1, 90 degrees (t huge), a mirror, and a constant source row (t = 0 / 0); the
    # output has partial tiles on both axes, where shifted rows fall past the last row.
    h, w = 150, 170
    imgs = [sample_photos((h, w))[i % 4] for i in range(12)]
    angles = [0.0, 12.0, -12.0, 33.0, -41.0, 45.0, -45.0, 63.0, 90.0, -90.0, 180.0, 251.0]
    mats = []
    for i, angle in enumerate(angles):
        m = cv2.getRotationMatrix2D((w / 2, h / 2), angle, 0.9 + 0.05 * i)
        m[:, 2] += (-20.0 + 3 * i, 11.0 - 2 * i)
        mats.append(m)
    mats[3][:, 2] += mats[3][:, 0] * 130.0  # mirrored: column x samples where column 130 - x did
    mats[3][:, 0] *= -1.0
    mats[11][1] = (0.0, 0.0, 75.3)  # every output pixel samples between source rows 75 and 76
    src = _cpu_batch_in(imgs, in_layout)
    M = torch.from_numpy(np.stack(mats))
    kw = dict(border_mode="constant", border_value=(9, 99, 199), inverse_map=True)
    norm = dict(out_dtype=torch.float32, mean=[100.0, 110.0, 120.0], std=[50.0, 55.0, 60.0])
    for extra in ({}, norm):
        cpu = warp_affine(src, M, (131, 45), **kw, **extra)
        cuda = warp_affine(src.cuda(), M.cuda(), (131, 45), **kw, **extra)
        assert torch.equal(cuda.cpu(), cpu)


@requires_cuda
@pytest.mark.parametrize("in_layout", ["NCHW", "NHWC"])
def test_cuda_blocks_over_several_rows_of_tiles(in_layout):
    # A batch of many output tiles (here 24 x 8 x 64 tiles of 128 x 16 pixels, more than 4 waves of
    # blocks on an H100) has each block of the 3-channel kernel loop over up to 4 rows of tiles:
    # every tile must still be written, once, as the CPU writes it.
    imgs, mats = _batch(41, (300, 400), (1024, 1000), n=24)
    src = _cpu_batch_in(imgs, in_layout)
    M = torch.from_numpy(mats)
    kw = dict(border_mode="constant", border_value=(9, 99, 199), reverse_channels=True)
    cpu = warp_affine(src, M, (1000, 1024), **kw)
    cuda = warp_affine(src.cuda(), M.cuda(), (1000, 1024), **kw)
    assert torch.equal(cuda.cpu(), cpu)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hw", [(1, 1), (1, 9), (9, 1), (2, 2)])
@pytest.mark.parametrize("border", BORDERS)
def test_tiny_3_channel_images(device, hw, border):
    # every output pixel has a tap outside such images: only the border-aware path runs
    rng = np.random.default_rng(hw[0] * 10 + hw[1])
    img = np.ascontiguousarray(sample_photos((9, 9))[0][: hw[0], : hw[1]])
    mats = np.stack([random_matrix(rng, hw, (7, 6)) for _ in range(2)])
    ref = _cv2_batch([img, img], mats, (7, 6), "bilinear", border, (5, 6, 7))
    for fmt in (torch.contiguous_format, torch.channels_last):
        src = _to_nchw([img, img], device).contiguous(memory_format=fmt)
        out = warp_affine(src, torch.from_numpy(mats).to(device), (6, 7), border_mode=border, border_value=(5, 6, 7))
        assert np.abs(out.permute(0, 2, 3, 1).cpu().numpy().astype(int) - ref).max() <= 1


@requires_cuda
@pytest.mark.parametrize("interp", INTERPS)
@pytest.mark.parametrize("border", BORDERS)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_cpu_equals_cuda(interp, border, dtype):
    imgs, mats = _batch(17, (250, 250), (112, 112), n=8)
    src = _to_nchw(imgs, "cpu").to(dtype)
    M = torch.from_numpy(mats)
    cpu = warp_affine(src, M, (112, 112), interpolation=interp, border_mode=border, border_value=(1, 2, 3))
    cuda = warp_affine(src.cuda(), M.cuda(), (112, 112), interpolation=interp, border_mode=border,
                       border_value=(1, 2, 3)).cpu()
    if dtype == torch.uint8:
        assert torch.equal(cpu, cuda)
    else:
        torch.testing.assert_close(cuda, cpu, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_affine_torch_is_the_inverse_map(device):
    imgs, mats = _batch(19, (250, 250), (112, 112), n=4)
    inv = torch.stack([invert_affine(torch.from_numpy(m)) for m in mats]).to(device)
    out = affine_torch(_to_nchw(imgs, device), inv, 112, 112)
    ref = _cv2_batch(imgs, mats, (112, 112), "bilinear", "constant")
    diff = np.abs(out.permute(0, 2, 3, 1).cpu().numpy().astype(np.int16) - ref)
    assert diff.max() <= 1 and (diff == 0).mean() >= 0.9999
    # the unbatched form with one matrix
    assert torch.equal(affine_torch(_to_nchw(imgs, device)[0], inv[0], 112, 112), out[0])


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device):
    src = torch.empty(0, 3, 20, 30, dtype=torch.uint8, device=device)
    out = warp_affine(src, torch.empty(0, 2, 3, device=device, dtype=torch.float64), (16, 8))
    assert out.shape == (0, 3, 8, 16)


@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_matrix_gives_border_value(device):
    imgs, mats = _batch(23, (40, 50), (20, 30), n=3)
    M = torch.from_numpy(mats).to(device)
    M[1, 0, 0] = float("nan")
    M[2, 1, 2] = float("inf")
    for border in BORDERS:
        out = warp_affine(_to_nchw(imgs, device), M, (30, 20), border_mode=border, border_value=(5, 6, 7),
                          inverse_map=True)
        expected = torch.tensor([5, 6, 7], dtype=torch.uint8, device=device).view(3, 1, 1).expand(3, 20, 30)
        assert torch.equal(out[1], expected) and torch.equal(out[2], expected), border
        assert not torch.equal(out[0], expected)


@pytest.mark.parametrize("device", DEVICES)
def test_far_coordinates_do_not_overflow(device):
    src = _to_nchw(sample_photos((30, 40))[:1], device)
    for shift in (1e9, -1e9, 3e12):
        M = torch.tensor([[1.0, 0.0, shift], [0.0, 1.0, 0.0]], dtype=torch.float64, device=device)
        for border in BORDERS:
            out = warp_affine(src, M, (16, 8), border_mode=border, inverse_map=True)
            assert out.shape == (1, 3, 8, 16)


@requires_cuda
def test_output_past_2_31_elements_is_written():
    # 1 x 1 x 46341 x 46341 > 2^31 elements: the far corner must be written too.
    src = torch.from_numpy(sample_photos((64, 64))[0][:, :, 0].copy()).view(1, 1, 64, 64).cuda()
    M = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64, device="cuda")
    out = warp_affine(src, M, (46341, 46341), border_value=7, inverse_map=True)
    assert out.numel() > 2**31
    assert torch.equal(out[..., :64, :64], src)
    assert bool((out[0, 0, -1, -1000:] == 7).all()) and bool((out[0, 0, -3:, -3:] == 7).all())
    del out


@requires_cuda
def test_runs_on_the_inputs_device_and_current_stream():
    imgs, mats = _batch(29, (64, 64), (32, 32), n=2)
    src = _to_nchw(imgs, "cuda")
    M = torch.from_numpy(mats).cuda()
    ref = warp_affine(src, M, (32, 32))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = warp_affine(src, M, (32, 32))
    stream.synchronize()
    assert torch.equal(out, ref)
    if torch.cuda.device_count() > 1:
        with torch.cuda.device(0):
            out1 = warp_affine(src.to("cuda:1"), M.to("cuda:1"), (32, 32))
        assert out1.device.index == 1 and torch.equal(out1.cpu(), ref.cpu())
