"""The fused output (normalisation, channel reversal, dtype, layout) and variable-size image lists
against the unfused result: orbbec's plain warp followed by the separate torch ops."""
import numpy as np
import pytest
import torch

from conftest import DEVICES, requires_cuda, sample_photos
from orbbec.warpaffine import warp_affine
from warp_reference import random_matrix

MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


def _batch(device, n=5, in_hw=(120, 150), out_hw=(64, 80), seed=0):
    rng = np.random.default_rng(seed)
    photos = sample_photos(in_hw)
    src = torch.from_numpy(np.stack([photos[i % 4] for i in range(n)])).permute(0, 3, 1, 2).contiguous().to(device)
    M = torch.from_numpy(np.stack([random_matrix(rng, in_hw, out_hw) for _ in range(n)])).to(device)
    return src, M


def _unfused(src, M, dsize, scale=1.0, mean=MEAN, std=STD, **kw):
    v = warp_affine(src.float(), M, dsize, **kw)  # the sampled value, not rounded to uint8
    mean_t = torch.tensor(mean, dtype=torch.float32, device=src.device).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32, device=src.device).view(1, -1, 1, 1)
    return (v * scale - mean_t) / std_t


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interp", ["nearest", "bilinear", "bicubic"])
@pytest.mark.parametrize("border", ["constant", "reflect101"])
def test_fused_float32_equals_unfused_bit_for_bit(device, interp, border):
    src, M = _batch(device, seed=1)
    kw = dict(interpolation=interp, border_mode=border, border_value=(3, 60, 200))
    fused = warp_affine(src, M, (80, 64), out_dtype=torch.float32, mean=MEAN, std=STD, **kw)
    assert fused.dtype == torch.float32 and fused.is_contiguous()
    assert torch.equal(fused, _unfused(src, M, (80, 64), **kw))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "scale,mean,std",
    [
        (1 / 255, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        (1.0, [127.5, 127.5, 127.5], [3e-7, -2.5e-3, 1e9]),  # quotients near 0 and huge, a negative std
        (1e-20, [0.0, 1e-19, -3e-18], [1.7e-12, 0.3, 7e11]),  # tiny scaled values, std far from 1
        (1e-30, [0.0, 0.0, 0.0], [1e-3, 1.0, 1e3]),  # scaled values near float32's smallest normals
        (3.7, [1e11, -1e11, 0.0], [1e-30, 2e13, 0.7]),  # quotients that overflow to infinity
    ],
)
def test_normalisation_is_the_division_for_any_parameters(device, scale, mean, std):
    # the fused output must stay torch's (x * scale - mean) / std bit for bit whatever the parameters:
    # a kernel that divides any other way (a reciprocal, fused steps) would drift at the extremes
    src, M = _batch(device, seed=7)
    fused = warp_affine(src, M, (80, 64), out_dtype=torch.float32, scale=scale, mean=mean, std=std)
    assert torch.equal(fused, _unfused(src, M, (80, 64), scale=scale, mean=mean, std=std))


@pytest.mark.parametrize("device", DEVICES)
def test_scale_reverse_layout_and_dtypes(device):
    src, M = _batch(device, seed=2)
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    ref = _unfused(src, M, (80, 64), scale=1 / 255.0, mean=mean, std=std)
    rgb = warp_affine(src, M, (80, 64), out_dtype=torch.float32, scale=1 / 255.0, mean=mean, std=std,
                      reverse_channels=True)
    # reversal picks input channel C-1-c for output channel c; mean/std belong to the output channel
    ref_rev = _unfused(src.flip(1), M, (80, 64), scale=1 / 255.0, mean=mean, std=std)
    assert torch.equal(rgb, ref_rev)
    nhwc = warp_affine(src, M, (80, 64), out_dtype=torch.float32, scale=1 / 255.0, mean=mean, std=std, out_layout="NHWC")
    assert nhwc.is_contiguous(memory_format=torch.channels_last) and torch.equal(nhwc, ref)
    for dtype in (torch.float16, torch.bfloat16):
        half = warp_affine(src, M, (80, 64), out_dtype=dtype, scale=1 / 255.0, mean=mean, std=std)
        assert half.dtype == dtype and torch.equal(half, ref.to(dtype))
    u8 = warp_affine(src, M, (80, 64), out_dtype=torch.uint8, scale=2.0, mean=[20.0], std=[1.5])
    ref_u8 = _unfused(src, M, (80, 64), scale=2.0, mean=[20.0] * 3, std=[1.5] * 3).round().clamp(0, 255).to(torch.uint8)
    assert torch.equal(u8, ref_u8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interp", ["nearest", "bilinear", "bicubic"])
@pytest.mark.parametrize("in_layout", ["NCHW", "NHWC"])
def test_reversal_takes_the_border_value_of_the_source_channel(device, interp, in_layout):
    # Output channel c reads input channel C-1-c, border included: with a constant border of three
    # different values, the reversed warp equals the warp of the flipped image with the values
    # flipped. The CUDA 3-channel uint8 kernel writes border pixels, its rim and its inner pixels on
    # three separate paths, each choosing the channel for itself.
    src, M = _batch(device, seed=5)
    if in_layout == "NHWC":
        src = src.contiguous(memory_format=torch.channels_last)
    bv = (3, 60, 200)
    kw = dict(interpolation=interp, border_mode="constant")
    for out_dtype, norm in ((torch.uint8, {}), (torch.float32, dict(mean=MEAN, std=STD))):
        out = warp_affine(src, M, (80, 64), out_dtype=out_dtype, reverse_channels=True, border_value=bv, **norm, **kw)
        ref = warp_affine(src.flip(1), M, (80, 64), out_dtype=out_dtype, border_value=bv[::-1], **norm, **kw)
        assert torch.equal(out, ref)
    # the border does show up: some pixels of the reversed uint8 output hold (200, 60, 3)
    u8 = warp_affine(src, M, (80, 64), reverse_channels=True, border_value=bv, **kw)
    assert ((u8[:, 0] == 200) & (u8[:, 1] == 60) & (u8[:, 2] == 3)).any()


@pytest.mark.parametrize("device", DEVICES)
def test_channels_last_input_to_nchw_float(device):
    src, M = _batch(device, seed=3)
    hwc = src.contiguous(memory_format=torch.channels_last)  # as a decoder's HWC batch
    out = warp_affine(hwc, M, (80, 64), out_dtype=torch.float32, mean=MEAN, std=STD, out_layout="NCHW")
    assert out.is_contiguous() and torch.equal(out, _unfused(src, M, (80, 64)))


def _decoded_list(device, seed=4):
    """Mixed-size HWC uint8 images as a JPEG decoder returns them (docs/workloads.md's varsize shapes)."""
    shapes = [(75, 100), (96, 128), (67, 100), (100, 75), (85, 128), (128, 96)]
    rng = np.random.default_rng(seed)
    imgs, mats = [], []
    for i, hw in enumerate(shapes * 2):
        imgs.append(torch.from_numpy(sample_photos(hw)[i % 4]).to(device))
        mats.append(random_matrix(rng, hw, (56, 56)))
    return imgs, torch.from_numpy(np.stack(mats)).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interp", ["bilinear", "nearest"])
def test_variable_size_list_equals_per_image_warps(device, interp):
    imgs, M = _decoded_list(device)
    out = warp_affine(imgs, M, (56, 56), interpolation=interp, border_mode="replicate")
    assert out.shape == (len(imgs), 3, 56, 56) and out.dtype == torch.uint8
    for i, im in enumerate(imgs):
        single = warp_affine(im.permute(2, 0, 1), M[i], (56, 56), interpolation=interp, border_mode="replicate")
        assert torch.equal(out[i], single), i
    normalised = warp_affine(imgs, M, (56, 56), interpolation=interp, out_dtype=torch.float32, mean=MEAN, std=STD,
                             reverse_channels=True, out_layout="NHWC")
    for i, im in enumerate(imgs):
        single = warp_affine(im.permute(2, 0, 1).unsqueeze(0), M[i:i + 1], (56, 56), interpolation=interp,
                             out_dtype=torch.float32, mean=MEAN, std=STD, reverse_channels=True)
        assert torch.equal(normalised[i:i + 1], single), i
    chw = warp_affine([im.permute(2, 0, 1) for im in imgs], M, (56, 56), interpolation=interp,
                      border_mode="replicate", input_layout="CHW")
    assert torch.equal(chw, out)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_and_list_bad_input(device):
    src, M = _batch(device, n=2)
    with pytest.raises(TypeError, match="'out_dtype'"):
        warp_affine(src, M, (8, 8), out_dtype=torch.int32)
    with pytest.raises(ValueError, match="'std'"):
        warp_affine(src, M, (8, 8), mean=[0.0], std=[1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="'mean'"):
        warp_affine(src, M, (8, 8), mean=[0.0, 1.0])
    with pytest.raises(ValueError, match="'out_layout'"):
        warp_affine(src, M, (8, 8), out_dtype=torch.float32, out_layout="HWC")
    imgs, Ml = _decoded_list(device)
    with pytest.raises(ValueError, match="'src'"):
        warp_affine([], Ml[:0], (8, 8))
    with pytest.raises(ValueError, match="'M'"):
        warp_affine(imgs, Ml[:3], (8, 8))
    with pytest.raises(ValueError, match=r"'src\[1\]'"):
        torch.ops.orbbec.warp_affine_list([imgs[0], imgs[1][:, :, :2]], Ml[:2], 8, 8, 1, 0, [0.0], torch.float32,
                                          [], [], 1.0, False, False)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_fused_and_list(device):
    src, M = _batch(device, n=2, in_hw=(20, 24), out_hw=(8, 10))
    torch.library.opcheck(torch.ops.orbbec.warp_affine_fused.default,
                          (src, M, 8, 10, 1, 0, [0.0], torch.float32, [1.0, 2.0, 3.0], [2.0], 0.5, True, True))
    imgs, Ml = _decoded_list(device)
    torch.library.opcheck(torch.ops.orbbec.warp_affine_list.default,
                          (imgs[:3], Ml[:3], 8, 10, 1, 3, [0.0], torch.float16, [], [], 1.0, False, False))


@requires_cuda
def test_list_warp_replays_in_a_cuda_graph():
    """The list warp's descriptor table is captured with the graph (not read on replay from a pinned
    host buffer that the host allocator has since handed out again)."""
    g = torch.Generator().manual_seed(5)
    imgs = [torch.randint(0, 200, (h, w, 3), generator=g, dtype=torch.uint8).cuda() for h, w in [(30, 40), (25, 33), (41, 20)]]
    M = torch.tensor([[0.9, -0.2, 3.0], [0.2, 0.9, -2.0]], dtype=torch.float64, device="cuda").expand(3, 2, 3)

    def run():
        return warp_affine(imgs, M, (24, 17), out_dtype=torch.float32, mean=[1.0, 2.0, 3.0])

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()  # warm-up outside the capture, as torch.cuda.graphs asks
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    churn = [torch.full((1 << 16,), 255, dtype=torch.uint8).pin_memory() for _ in range(16)]
    for im in imgs:
        im.add_(7)  # new pixels at the same addresses
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, run()) and len(churn) == 16
