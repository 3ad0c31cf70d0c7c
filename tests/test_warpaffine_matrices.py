"""Matrix helpers and align_faces against cv2, numpy and scikit-image."""
import cv2
import numpy as np
import pytest
import torch

from conftest import DEVICES, sample_photos
from orbbec.warpaffine import (
    affine_opencv,
    align_faces,
    arcface_template,
    estimate_affine,
    estimate_similarity,
    get_affine_transform,
    invert_affine,
    warp_affine,
)
from warp_reference import random_matrix


@pytest.mark.parametrize("device", DEVICES)
def test_get_affine_transform_matches_cv2(device):
    rng = np.random.default_rng(0)
    src = rng.uniform(0, 300, (16, 3, 2)).astype(np.float32)
    dst = rng.uniform(0, 300, (16, 3, 2)).astype(np.float32)
    got = get_affine_transform(torch.from_numpy(src).to(device), torch.from_numpy(dst).to(device))
    assert got.dtype == torch.float64 and got.device.type == device
    for i in range(16):
        np.testing.assert_allclose(got[i].cpu().numpy(), cv2.getAffineTransform(src[i], dst[i]), rtol=1e-7, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_invert_affine_matches_cv2(device):
    rng = np.random.default_rng(1)
    mats = np.stack([random_matrix(rng, (100, 120), (80, 90)) for _ in range(10)] + [np.zeros((2, 3))])
    got = invert_affine(torch.from_numpy(mats).to(device)).cpu().numpy()
    for i, m in enumerate(mats):
        np.testing.assert_allclose(got[i], cv2.invertAffineTransform(m), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_invert_affine_op_equals_the_differentiable_formula(device):
    # Without grad the one-kernel op runs; with grad the torch formula. Same bits, also for singular,
    # huge and non-finite matrices, and for any batch shape.
    rng = np.random.default_rng(5)
    mats = np.stack([random_matrix(rng, (100, 120), (80, 90)) for _ in range(13)]
                    + [np.zeros((2, 3)), np.full((2, 3), np.nan), [[1e300, 2, 3], [4, 1e-300, 6]],
                       [[np.inf, 0, 1], [0, 1, 2]], [[2, 4, 1], [1, 2, 5]]])
    M = torch.from_numpy(mats).to(device).reshape(3, 6, 2, 3)
    fast = invert_affine(M)
    with torch.enable_grad():
        slow = invert_affine(M.clone().requires_grad_()).detach()
    assert fast.shape == M.shape and fast.dtype == torch.float64
    assert torch.equal(fast.isnan(), slow.isnan())
    assert torch.equal(torch.nan_to_num(fast), torch.nan_to_num(slow))
    with pytest.raises(TypeError, match="'M'"):
        torch.ops.orbbec.invert_affine(M.reshape(-1, 2, 3).float())
    with pytest.raises(ValueError, match="'M'"):
        torch.ops.orbbec.invert_affine(M.reshape(-1, 6))


@pytest.mark.parametrize("device", DEVICES)
def test_estimate_affine_is_least_squares(device):
    rng = np.random.default_rng(2)
    src = rng.uniform(0, 112, (8, 5, 2))
    true = np.stack([random_matrix(rng, (112, 112), (250, 250)) for _ in range(8)])
    dst = np.einsum("bij,bnj->bni", true[:, :, :2], src) + true[:, None, :, 2] + rng.normal(0, 0.5, (8, 5, 2))
    got = estimate_affine(torch.from_numpy(src).to(device), torch.from_numpy(dst).to(device)).cpu().numpy()
    for i in range(8):
        S = np.hstack([src[i], np.ones((5, 1))])
        ref, *_ = np.linalg.lstsq(S, dst[i], rcond=None)
        np.testing.assert_allclose(got[i], ref.T, rtol=1e-8, atol=1e-8)
    exact = estimate_affine(torch.from_numpy(src[:, :3]), torch.from_numpy(dst[:, :3]))
    torch.testing.assert_close(exact, get_affine_transform(torch.from_numpy(src[:, :3]), torch.from_numpy(dst[:, :3])))


@pytest.mark.parametrize("device", DEVICES)
def test_estimate_similarity_matches_skimage(device):
    from skimage.transform import SimilarityTransform

    rng = np.random.default_rng(3)
    template = arcface_template(112).numpy()
    src = template[None] * rng.uniform(1.5, 3.0, (12, 1, 1)) + rng.uniform(0, 200, (12, 1, 2)) + rng.normal(0, 2, (12, 5, 2))
    src[::3, :, 0] *= -1  # mirrored faces: the estimate must stay a proper rotation
    got = estimate_similarity(torch.from_numpy(src).to(device), torch.from_numpy(template).to(device).expand(12, 5, 2))
    for i in range(12):
        tform = SimilarityTransform()
        tform.estimate(src[i], template)
        np.testing.assert_allclose(got[i].cpu().numpy(), tform.params[:2], rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
def test_align_faces_matches_norm_crop(device):
    """insightface's norm_crop: SimilarityTransform(landmarks -> template) then cv2.warpAffine."""
    from skimage.transform import SimilarityTransform

    rng = np.random.default_rng(4)
    photos = sample_photos((300, 280))
    template = arcface_template(112).numpy()
    landmarks = np.stack([
        (template - 56) * rng.uniform(1.2, 2.0) @ np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]).T
        + rng.uniform(100, 180, 2) for a in rng.uniform(-0.5, 0.5, 4)
    ])
    images = torch.from_numpy(np.stack(photos)).permute(0, 3, 1, 2).contiguous().to(device)
    out = align_faces(images, torch.from_numpy(landmarks).to(device), size=112).permute(0, 2, 3, 1).cpu().numpy()
    for i in range(4):
        tform = SimilarityTransform()
        tform.estimate(landmarks[i], template)
        ref = cv2.warpAffine(photos[i], tform.params[:2], (112, 112), borderValue=0.0)
        diff = np.abs(out[i].astype(np.int16) - ref)
        assert diff.max() <= 1, diff.max()


def test_affine_opencv_matches_cv2():
    img = sample_photos((120, 160))[2]
    src = np.array([[10, 10], [150, 20], [30, 110]], np.float32)
    dst = np.array([[0, 0], [140, 5], [10, 100]], np.float32)
    try:
        out = affine_opencv(img, src, dst, (100, 90))
    except ImportError as exc:
        pytest.skip(f"orbbec built without OpenCV's C++ library: {exc}")
    M = cv2.getAffineTransform(src, dst)
    ref = cv2.warpAffine(img, M, (100, 90))
    assert out.shape == (90, 100, 3)
    # Debian's OpenCV 4.6 warps in fixed point (1/32 pixel), cv2 5 in float32: at most a few levels.
    assert np.abs(out.astype(np.int16) - ref).max() <= 3
    gray = affine_opencv(img[:, :, 0].copy(), src, dst)
    assert gray.shape == (120, 160)
    ours = warp_affine(torch.from_numpy(img).permute(2, 0, 1), torch.from_numpy(M), (100, 90)).permute(1, 2, 0).numpy()
    assert np.abs(ours.astype(np.int16) - out).max() <= 3
    with pytest.raises(ValueError, match="src_points"):
        affine_opencv(img, src[:2], dst)
    with pytest.raises(TypeError, match="img"):
        affine_opencv(img.astype(np.float32), src, dst)
