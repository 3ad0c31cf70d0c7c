"""orbbec.augment: reproducible per-sample parameters, transforms against direct references, and
targets that land where the warped image puts them (markers painted into real photographs)."""
import cv2
import numpy as np
import pytest
import torch

from conftest import DEVICES, sample_photos

import orbbec.augment as A


def _photo(i, size):
    return torch.from_numpy(sample_photos(size)[i % 4].copy())


def test_parameters_depend_on_seed_epoch_and_index_only():
    aug = A.Compose([A.RandomResizedCrop(96), A.RandomAffine(20, (0.1, 0.1), (0.8, 1.2)), A.RandomHorizontalFlip()])
    sizes = [(240, 320), (200, 300), (180, 180)]
    batch = aug.draw(sizes, [4, 9, 17], epoch=3, seed=11)
    alone = aug.draw([sizes[1]], [9], epoch=3, seed=11)
    assert torch.equal(batch.matrices[1], alone.matrices[0]) and batch.samples[1] == alone.samples[0]
    other_epoch = aug.draw([sizes[1]], [9], epoch=4, seed=11)
    other_seed = aug.draw([sizes[1]], [9], epoch=3, seed=12)
    assert not torch.equal(other_epoch.matrices[0], alone.matrices[0])
    assert not torch.equal(other_seed.matrices[0], alone.matrices[0])
    flips = [aug.draw([sizes[0]], [k], seed=1).samples[0]["RandomHorizontalFlip.hflip"] for k in range(64)]
    assert 16 < sum(flips) < 48  # p = 0.5, per sample


def test_batch_draws_follow_the_public_sample_rng():
    """Compose.draw re-keys one generator per sample (cheap); a user reproducing a sample's draws with
    sample_rng(seed, epoch, index) must get the same stream."""
    from orbbec.augment._random import SampleRngs

    rngs = SampleRngs(seed=11, epoch=3)
    for index in (0, 9, 2**40 + 5):
        fast = rngs.for_index(index)
        fast_draws = [fast.random(), fast.uniform(-3, 3), int(fast.integers(0, 10**6)), fast.normal()]
        ref = A.sample_rng(11, 3, index)
        assert fast_draws == [ref.random(), ref.uniform(-3, 3), int(ref.integers(0, 10**6)), ref.normal()]
    firsts = {(s, e, i): A.sample_rng(s, e, i).random() for s in (0, 1, -1) for e in (0, 1, 2) for i in (0, 1, 1000)}
    assert len(set(firsts.values())) == len(firsts)  # every (seed, epoch, index) its own stream


def test_the_cheap_uniform_draws_what_numpys_uniform_draws():
    """The transforms draw through _random.uniform (a third of rng.uniform's cost): the same values
    from the same stream, the stream left where rng.uniform leaves it."""
    import platform

    from orbbec.augment._random import uniform

    ours, numpys = A.sample_rng(5, 1, 77), A.sample_rng(5, 1, 77)
    bounds = [(0.08, 1.0), (-30.0, 30.0), (-0.287, 0.287), (-1e9, -1e-3), (1e-3, 1e9), (4.0, 4.0)]
    got = [uniform(ours, lo, hi) for _ in range(5000) for lo, hi in bounds]
    want = [numpys.uniform(lo, hi) for _ in range(5000) for lo, hi in bounds]
    if platform.machine() in ("x86_64", "AMD64"):
        assert got == want
    else:  # numpy's C may fuse the multiply-add there: the last bit may differ
        np.testing.assert_allclose(got, want, rtol=1e-15, atol=0)
    assert ours.random() == numpys.random()


@pytest.mark.parametrize("device", DEVICES)
def test_flip_and_center_crop_are_exact(device):
    img = _photo(0, (120, 160)).to(device)
    flip = A.Compose([A.RandomHorizontalFlip(p=1.0)])
    p = flip.draw([(120, 160)], [0])
    out = flip.apply([img], p)[0].permute(1, 2, 0)
    assert torch.equal(out, img.flip(1))
    crop = A.Compose([A.CenterCrop((64, 100))])
    p = crop.draw([(120, 160)], [0])
    out = crop.apply([img], p)[0].permute(1, 2, 0)
    assert torch.equal(out, img[28:92, 30:130])


def test_resize_matches_cv2_resize():
    img = _photo(1, (240, 320))
    aug = A.Compose([A.Resize((100, 150))])
    out = aug.apply([img], aug.draw([(240, 320)], [0]))[0].permute(1, 2, 0).numpy()
    ref = cv2.resize(img.numpy(), (150, 100), interpolation=cv2.INTER_LINEAR)
    d = np.abs(out.astype(int) - ref.astype(int))
    # same sampling positions; cv2.resize's fixed-point weights round differently from warpAffine's
    assert d.max() <= 1 and d.mean() < 0.2
    assert A.Resize(64)(None, (240, 320))[1] == (64, 85)  # torchvision: smaller edge to 64


@pytest.mark.parametrize("device", DEVICES)
def test_normalize_is_fused_as_torchvision_defines_it(device):
    img = _photo(2, (64, 64)).to(device)
    aug = A.Compose([A.CenterCrop(64), A.Normalize(A.IMAGENET_MEAN, A.IMAGENET_STD)])
    out = aug.apply([img], aug.draw([(64, 64)], [0]))[0]
    ref = (img.permute(2, 0, 1).float() / 255 - torch.tensor(A.IMAGENET_MEAN, device=device)[:, None, None]) \
        / torch.tensor(A.IMAGENET_STD, device=device)[:, None, None]
    assert torch.allclose(out, ref, atol=1e-5)


def _paint(img, box, colour):
    x0, y0, x1, y1 = box
    img[y0:y1, x0:x1] = torch.tensor(colour, dtype=torch.uint8)


def _mask_box(out_hwc, colour, near=None, radius=12):
    """Bounding box of the pixels of `colour` (within `near` +- radius when given, so that photo
    pixels of a similar colour elsewhere do not count)."""
    d = (out_hwc.int() - torch.tensor(colour)).abs().max(dim=2).values
    if near is not None:
        x, y = int(near[0]), int(near[1])
        window = torch.full_like(d, 255)
        window[max(0, y - radius):y + radius, max(0, x - radius):x + radius] = 0
        d = torch.maximum(d, window)
    ys, xs = torch.nonzero(d < 60, as_tuple=True)
    assert len(xs), f"no pixel of colour {colour} found"
    return xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1


CHAINS = {
    "affine": lambda: [A.RandomAffine(25, (0.05, 0.05), (0.9, 1.1)), A.RandomHorizontalFlip(), A.Resize((200, 260))],
    "canvas": lambda: [A.RandomRotation(20), A.RandomZoomOut(side_range=(1.0, 1.3), p=1.0),
                       A.RandomCrop((300, 400), pad_if_needed=True), A.RandomHorizontalFlip(), A.Resize((200, 260))],
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chain", sorted(CHAINS))
@pytest.mark.parametrize("index", range(6))
def test_boxes_and_keypoints_land_where_the_image_puts_them(device, chain, index):
    img = _photo(index, (240, 320))
    box = (120, 80, 180, 130)  # xyxy, pixel edges
    _paint(img, box, (0, 255, 0))
    keypoints = torch.tensor([[60.5, 50.5], [250.5, 190.5]])  # centres of painted 5x5 squares
    for (x, y), c in zip(keypoints.tolist(), [(255, 0, 255), (0, 255, 255)]):
        _paint(img, (int(x) - 2, int(y) - 2, int(x) + 3, int(y) + 3), c)
    aug = A.Compose(CHAINS[chain]())
    p = aug.draw([(240, 320)], [index], seed=7)
    out = aug.apply([img.to(device)], p)[0].permute(1, 2, 0).cpu()
    boxes, kept = A.transform_boxes(torch.tensor([box], dtype=torch.float32), p.matrices[0], p.size)
    assert kept.all()
    found = _mask_box(out, (0, 255, 0))
    assert np.allclose(found, boxes[0].tolist(), atol=2.5), (found, boxes[0].tolist())
    moved, inside = A.transform_keypoints(keypoints, p.matrices[0], p.size)
    assert inside.all()
    for (x, y), c in zip(moved.tolist(), [(255, 0, 255), (0, 255, 255)]):
        x0, y0, x1, y1 = _mask_box(out, c, near=(x, y))
        assert abs((x0 + x1) / 2 - x) < 1.5 and abs((y0 + y1) / 2 - y) < 1.5


def test_boxes_of_a_batch_in_one_call_equal_one_call_per_sample():
    # The loader moves a batch's boxes in one call, each box with its sample's matrix.
    rng = np.random.default_rng(11)
    aug = A.Compose([A.RandomAffine(30, (0.2, 0.2), (0.6, 1.4)), A.RandomHorizontalFlip()])
    counts = [0, 1, 4, 7, 2, 5]
    p = aug.draw([(480, 640)] * len(counts), list(range(len(counts))), seed=3)
    boxes = []
    for n in counts:
        xy = rng.uniform(-40, 600, (n, 2))
        wh = rng.uniform(4, 160, (n, 2))
        boxes.append(torch.tensor(np.concatenate([xy, xy + wh], axis=1), dtype=torch.float32))
    per_box = p.matrices.to(torch.float64).repeat_interleave(torch.tensor(counts), dim=0)
    moved, kept = A.transform_boxes(torch.cat(boxes), per_box, p.size, min_visible=0.4)
    assert 0 < int(kept.sum()) < sum(counts)  # some boxes left the output
    alone = [A.transform_boxes(b, p.matrices[i], p.size, min_visible=0.4) for i, b in enumerate(boxes)]
    assert torch.equal(kept, torch.cat([k for _, k in alone]))
    assert torch.equal(moved, torch.cat([m for m, _ in alone]))


def test_boxes_numpy_and_torch_give_the_same_bits_and_the_extreme_corners():
    # Loader workers move boxes in numpy; users call transform_boxes with tensors. Both must agree to
    # the bit, and the enclosing box must be the extreme of all four corners moved one by one.
    rng = np.random.default_rng(5)
    n = 400
    xy = rng.uniform(-100, 700, (n, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(-20, 300, (n, 2))], axis=1)  # some with x1 < x0
    angle = rng.uniform(-np.pi, np.pi, n)
    scale = rng.uniform(0.3, 3.0, n)
    M = np.stack([np.stack([scale * np.cos(angle), -scale * np.sin(angle), rng.uniform(-200, 200, n)], 1),
                  np.stack([scale * np.sin(angle), scale * np.cos(angle), rng.uniform(-200, 200, n)], 1)], 1)
    M[:, :, :2] += rng.uniform(-0.3, 0.3, (n, 2, 2))  # shear too
    for dtype in (np.float32, np.float64):
        b = boxes.astype(dtype)
        moved_np, kept_np = A.transform_boxes(b, M, (480, 640), min_visible=0.3)
        moved_t, kept_t = A.transform_boxes(torch.from_numpy(b), torch.from_numpy(M), (480, 640), min_visible=0.3)
        assert isinstance(moved_np, np.ndarray) and moved_np.dtype == dtype and moved_t.dtype == torch.from_numpy(b).dtype
        assert 0 < kept_np.sum() < n
        assert np.array_equal(kept_np, kept_t.numpy()) and np.array_equal(moved_np, moved_t.numpy())
    b = boxes - 0.5
    corners = [(b[:, i], b[:, j]) for i in (0, 2) for j in (1, 3)]
    xs = np.stack([x * M[:, 0, 0] + y * M[:, 0, 1] + M[:, 0, 2] + 0.5 for x, y in corners], 1)
    ys = np.stack([x * M[:, 1, 0] + y * M[:, 1, 1] + M[:, 1, 2] + 0.5 for x, y in corners], 1)
    want = np.stack([xs.min(1), ys.min(1), xs.max(1), ys.max(1)], 1)
    assert np.array_equal(A.enclosing_boxes(torch.from_numpy(boxes), torch.from_numpy(M)).numpy(), want)


def test_keypoints_numpy_and_torch_give_the_same_bits_and_flip_pairs_per_sample():
    # Loader workers move a face batch's landmarks in numpy, users call with tensors.
    rng = np.random.default_rng(8)
    n = 64
    pts = rng.uniform(-20, 140, (n, 5, 2)).astype(np.float32)
    M = rng.normal(0, 1, (n, 2, 3)) + np.array([[1.0, 0, 0], [0, 1.0, 0]])
    M[:, :, 2] *= 40
    flipped = rng.random(n) < 0.5
    got_np, in_np = A.transform_landmarks(pts, M, (112, 112), flipped)
    got_t, in_t = A.transform_landmarks(torch.from_numpy(pts), torch.from_numpy(M), (112, 112), torch.from_numpy(flipped))
    assert isinstance(got_np, np.ndarray) and got_np.dtype == np.float32
    assert np.array_equal(got_np, got_t.numpy()) and np.array_equal(in_np, in_t.numpy())
    assert 0 < in_np.sum() < in_np.size
    # An independent reference: a matrix product per sample, then the face's left/right pairs swapped.
    want = np.einsum("bij,bkj->bki", M[:, :, :2], pts.astype(np.float64)) + M[:, None, :, 2]
    swap = [1, 0, 2, 4, 3]  # FACE5_FLIP_PAIRS
    want[flipped] = want[flipped][:, swap]
    assert np.allclose(got_np, want, atol=1e-4)


def test_boxes_are_clipped_and_dropped_and_flip_pairs_swap():
    flip = A.Compose([A.RandomHorizontalFlip(p=1.0)])
    p = flip.draw([(100, 200)], [0])
    boxes, kept = A.transform_boxes(torch.tensor([[10.0, 10, 50, 40], [190, 0, 260, 30]]), p.matrices[0], p.size)
    assert kept.tolist() == [True, True]
    assert torch.allclose(boxes[0], torch.tensor([150.0, 10, 190, 40]))
    assert torch.allclose(boxes[1], torch.tensor([0.0, 0, 10, 30]))  # clipped to the image
    _, kept = A.transform_boxes(torch.tensor([[190.0, 0, 260, 30]]), p.matrices[0], p.size, min_visible=0.5)
    assert kept.tolist() == [False]  # 10 of 70 pixels of width remain
    eyes = torch.tensor([[70.0, 40.0], [130.0, 40.0]])  # left eye, right eye
    moved, inside = A.transform_keypoints(eyes, p.matrices[0], p.size, flipped=True, flip_pairs=[(0, 1)])
    assert torch.allclose(moved, torch.tensor([[70.0, 40.0], [130.0, 40.0]])) and inside.all()
    assert not A.transform_keypoints(torch.tensor([[250.0, 10.0]]), torch.eye(3)[:2], (100, 200))[1].any()


def test_compose_refuses_ragged_outputs_and_misplaced_normalize():
    with pytest.raises(ValueError, match="fixed size"):
        A.Compose([A.RandomHorizontalFlip()]).draw([(10, 20), (20, 10)], [0, 1])
    with pytest.raises(ValueError, match="last"):
        A.Compose([A.Normalize(A.IMAGENET_MEAN, A.IMAGENET_STD), A.Resize(8)])


@pytest.mark.parametrize("make, name", [
    (lambda: A.RandomResizedCrop(64, scale=(1.0, 0.08)), "RandomResizedCrop.scale"),
    (lambda: A.RandomResizedCrop(64, ratio=(4 / 3, 3 / 4)), "RandomResizedCrop.ratio"),
    (lambda: A.RandomAffine((20, -20)), "RandomAffine.degrees"),
    (lambda: A.RandomAffine(0, scale=(1.25, 0.75)), "RandomAffine.scale"),
    (lambda: A.RandomAffine(0, shear=(10, -10)), "RandomAffine.shear"),
    (lambda: A.RandomAffine(0, shear=(-10, 10, 5, -5)), r"RandomAffine.shear \(y\)"),
    (lambda: A.RandomRotation((30, 10)), "RandomRotation.degrees"),
])
def test_an_inverted_range_is_refused_naming_the_argument(make, name):
    """(max, min) is refused when the transform is made, not at the first sample in a worker."""
    with pytest.raises(ValueError, match=f"{name}: expected \\(min, max\\)"):
        make()


# Against torchvision.transforms.v2 given the same parameters (skipped where torchvision is missing).

def _v2():
    return pytest.importorskip("torchvision.transforms.v2.functional", reason="torchvision is not installed")


def _rgb(i, size):
    return torch.from_numpy(sample_photos(size)[i % 4][:, :, ::-1].copy())


def _close_inside(out, ref, rim=2, level=1, share=0.99):
    """uint8 CHW images equal within `level` on `share` of the pixels away from a `rim` (where
    border handling differs: torchvision clamps, the warp fills)."""
    d = (out.int() - ref.int()).abs()[:, rim:-rim, rim:-rim]
    assert (d <= level).float().mean() >= share, f"only {(d <= level).float().mean():.4f} within {level}"


@pytest.mark.parametrize("device", DEVICES)
def test_geometric_transforms_match_torchvision_v2(device):
    F = _v2()
    img = _rgb(0, (160, 200)).to(device)
    chw = img.permute(2, 0, 1).contiguous()
    for k in range(6):
        aug = A.Compose([A.RandomResizedCrop((96, 112), scale=(0.2, 1.0)), A.RandomHorizontalFlip()])
        p = aug.draw([(160, 200)], [k], seed=4)
        x, y, cw, ch = p.samples[0]["RandomResizedCrop.crop"]
        ref = F.resized_crop(chw, y, x, ch, cw, [96, 112], antialias=False)
        if p.samples[0]["RandomHorizontalFlip.hflip"]:
            ref = F.horizontal_flip(ref)
        _close_inside(aug.apply([img], p)[0], ref)
    for k in range(6):
        aug = A.Compose([A.RandomAffine(30, (0.1, 0.1), (0.8, 1.2), shear=(-10, 10, -5, 5))])
        p = aug.draw([(160, 200)], [k], seed=4)
        s = p.samples[0]
        ref = F.affine(chw, angle=s["RandomAffine.angle"], translate=list(s["RandomAffine.translate"]),
                       scale=s["RandomAffine.scale"], shear=list(s["RandomAffine.shear"]),
                       interpolation=F.InterpolationMode.BILINEAR)
        _close_inside(aug.apply([img], p)[0], ref, rim=4, share=0.98)
    aug = A.Compose([A.Resize((240, 300)), A.RandomVerticalFlip(p=1.0)])
    ref = F.vertical_flip(F.resize(chw, [240, 300], antialias=False))
    _close_inside(aug.apply([img], aug.draw([(160, 200)], [0]))[0], ref)


@pytest.mark.parametrize("device", DEVICES)
def test_pads_and_random_crops_equal_torchvision_v2(device):
    """Pad and RandomCrop (padding, pad_if_needed, a crop larger than the image) move whole pixels:
    equal to torchvision's pad + crop with the drawn offsets, border included; each offset drawn."""
    F = _v2()
    img = _rgb(1, (60, 90)).to(device)
    chw = img.permute(2, 0, 1).contiguous()
    cases = [A.Pad(5), A.Pad((3, 7)), A.Pad((1, 2, 3, 4)), A.RandomCrop(48), A.RandomCrop((56, 80), padding=4),
             A.RandomCrop((50, 100), padding=(2, 6), pad_if_needed=True), A.RandomCrop(96, pad_if_needed=True)]
    for t in cases:
        aug = A.Compose([t])
        offsets = set()
        for k in range(5):
            p = aug.draw([(60, 90)], [k], seed=3)
            s = {key.split(".", 1)[1]: v for key, v in p.samples[0].items()}
            ref = F.pad(chw, list(s["padding"]), fill=0)
            if "crop" in s:
                x, y, cw, ch = s["crop"]
                ref = F.crop(ref, y, x, ch, cw)
                offsets.add((x, y))
            assert torch.equal(aug.apply([img], p)[0], ref), (type(t).__name__, k)
        if isinstance(t, A.RandomCrop) and t.size != (96, 96):
            assert len(offsets) > 1, type(t).__name__
    with pytest.raises(ValueError, match="pad_if_needed"):
        A.Compose([A.RandomCrop(96)]).draw([(60, 90)], [0])
    for bad in (lambda: A.Pad(2, fill=3), lambda: A.RandomCrop(8, padding_mode="reflect"),
                lambda: A.RandomRotation(10, expand=True)):
        with pytest.raises(ValueError):
            bad()


@pytest.mark.parametrize("device", DEVICES)
def test_rotation_zoom_out_and_rescales_match_torchvision_v2(device):
    """RandomRotation (counter-clockwise, about the centre or a given point), RandomZoomOut,
    ScaleJitter and RandomShortestSize given their drawn parameters, against torchvision's rotate,
    pad and resize (bilinear, no antialiasing)."""
    F = _v2()
    img = _rgb(2, (120, 160)).to(device)
    chw = img.permute(2, 0, 1).contiguous()
    for center in (None, (40, 70)):
        aug = A.Compose([A.RandomRotation(30, center=center)])
        for k in range(4):
            p = aug.draw([(120, 160)], [k], seed=8)
            ref = F.rotate(chw, p.samples[0]["RandomRotation.angle"], F.InterpolationMode.BILINEAR,
                           center=list(center) if center else None)
            _close_inside(aug.apply([img], p)[0], ref, rim=4, share=0.98)
    aug = A.Compose([A.RandomZoomOut(side_range=(1.2, 2.5), p=0.7), A.Resize((96, 128))])
    zoomed = 0
    for k in range(6):
        p = aug.draw([(120, 160)], [k], seed=8)
        padding = p.samples[0]["RandomZoomOut.padding"]
        zoomed += any(padding)
        ref = F.resize(F.pad(chw, list(padding), fill=0), [96, 128], antialias=False)
        _close_inside(aug.apply([img], p)[0], ref)
    assert 0 < zoomed < 6  # p = 0.7
    for t in (A.ScaleJitter((100, 140), (0.5, 1.5)), A.RandomShortestSize([64, 80, 100], max_size=150)):
        aug = A.Compose([t, A.RandomCrop(90, pad_if_needed=True)])
        sizes = set()
        for k in range(6):
            p = aug.draw([(120, 160)], [k], seed=8)
            s = {key.split(".", 1)[1]: v for key, v in p.samples[0].items()}
            sizes.add(s["size"])
            x, y, cw, ch = s["crop"]
            ref = F.crop(F.pad(F.resize(chw, list(s["size"]), antialias=False), list(s["padding"]), fill=0), y, x, ch, cw)
            _close_inside(aug.apply([img], p)[0], ref)
        assert len(sizes) > 1, type(t).__name__
    # torchvision's own size arithmetic
    p = A.Compose([A.ScaleJitter((100, 140), (1.0, 1.0))]).draw([(120, 160)], [0])
    assert p.size == (int(120 * min(140 / 120, 100 / 160)), int(160 * min(140 / 120, 100 / 160)))
    p = A.Compose([A.RandomShortestSize(64, max_size=80)]).draw([(120, 160)], [0])
    assert p.size == (int(120 * 0.5), int(160 * 0.5))


@pytest.mark.parametrize("device", DEVICES)
def test_colour_transforms_match_torchvision_v2_in_each_samples_order(device):
    F = _v2()
    imgs = [_rgb(i, (64, 80)).to(device) for i in range(8)]
    aug = A.Compose([A.Resize((64, 80)), A.ColorJitter(0.5, 0.5, 0.5, 0.2), A.RandomGrayscale(0.3)])
    p = aug.draw([(64, 80)] * 8, list(range(8)), seed=21)
    out = aug.apply(imgs, p)
    adjust = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]
    names = ["brightness", "contrast", "saturation", "hue"]
    orders = set()
    for k, img in enumerate(imgs):
        x = img.permute(2, 0, 1).float() / 255
        jitter = p.samples[k]["ColorJitter"]
        orders.add(tuple(jitter["order"]))
        for a in jitter["order"]:
            x = adjust[a](x, jitter[names[a]])
        if p.samples[k]["RandomGrayscale"]["gray"]:
            x = F.rgb_to_grayscale(x, num_output_channels=3)
        assert torch.allclose(out[k], x, atol=2e-5), k
    assert len(orders) > 1  # the order is drawn per sample


@pytest.mark.parametrize("device", DEVICES)
def test_random_erasing_is_torchvisions_erase_with_each_samples_rectangle(device):
    """RandomErasing after Normalize: each sample that drew a rectangle equals torchvision's erase of
    the same batch without it, at that rectangle; the others are untouched; p and the area range hold."""
    F = _v2()
    imgs = [_rgb(i, (64, 80)).to(device) for i in range(40)]
    base = [A.RandomHorizontalFlip(), A.Normalize(A.IMAGENET_MEAN, A.IMAGENET_STD)]
    erasing = A.Compose(base + [A.RandomErasing(p=0.6, scale=(0.05, 0.3), value=(0.5, -1.0, 2.0))])
    p = erasing.draw([(64, 80)] * 40, list(range(40)), seed=13)
    out = erasing.apply(imgs, p)
    plain = A.Compose(base).apply(imgs, p)
    rects = [s["RandomErasing"]["erase"] for s in p.samples]
    assert 14 <= sum(r is not None for r in rects) <= 34
    for k, r in enumerate(rects):
        if r is None:
            assert torch.equal(out[k], plain[k])
            continue
        top, left, h, w = r
        assert 0.05 * 64 * 80 * 0.8 <= h * w <= 0.3 * 64 * 80 * 1.2
        ref = F.erase(plain[k], top, left, h, w, torch.tensor([0.5, -1.0, 2.0], device=device).view(3, 1, 1))
        assert torch.equal(out[k], ref), k
    with pytest.raises(ValueError, match="last"):
        A.Compose([A.RandomErasing(), A.Normalize(A.IMAGENET_MEAN, A.IMAGENET_STD)])
    with pytest.raises(ValueError, match="random"):
        A.RandomErasing(value="random")


@pytest.mark.parametrize("device", DEVICES)
def test_photometric_distort_matches_torchvision_v2_in_each_samples_steps(device):
    """RandomPhotometricDistort: each sample's drawn steps (brightness, contrast before or after
    saturation and hue, channel order) through torchvision's functional ops give its pixels."""
    F = _v2()
    imgs = [_rgb(i, (48, 64)).to(device) for i in range(24)]
    aug = A.Compose([A.Resize((48, 64)), A.RandomPhotometricDistort(p=0.6)])
    p = aug.draw([(48, 64)] * 24, list(range(24)), seed=17)
    out = aug.apply(imgs, p)
    permuted = 0
    for k, img in enumerate(imgs):
        d = p.samples[k]["RandomPhotometricDistort"]
        x = img.permute(2, 0, 1).float() / 255
        if d["brightness"] is not None:
            x = F.adjust_brightness(x, d["brightness"])
        if d["contrast"] is not None and d["contrast_before"]:
            x = F.adjust_contrast(x, d["contrast"])
        if d["saturation"] is not None:
            x = F.adjust_saturation(x, d["saturation"])
        if d["hue"] is not None:
            x = F.adjust_hue(x, d["hue"])
        if d["contrast"] is not None and not d["contrast_before"]:
            x = F.adjust_contrast(x, d["contrast"])
        if d["channels"] is not None:
            x = F.permute_channels(x, d["channels"])
            permuted += d["channels"] != [0, 1, 2]
        assert torch.allclose(out[k], x, atol=2e-5), (k, d)
    assert permuted > 0 and len({s["RandomPhotometricDistort"]["contrast_before"] for s in p.samples}) == 2


def _iou_with(boxes, region):
    l, t, r, b = region
    iw = np.clip(np.minimum(boxes[:, 2], r) - np.maximum(boxes[:, 0], l), 0, None)
    ih = np.clip(np.minimum(boxes[:, 3], b) - np.maximum(boxes[:, 1], t), 0, None)
    inter = iw * ih
    return inter / ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) + (r - l) * (b - t) - inter)


@pytest.mark.parametrize("device", DEVICES)
def test_iou_crop_holds_the_centres_it_keeps_and_overlaps_one_enough(device):
    """RandomIoUCrop as torchvision defines it: each crop keeps exactly the boxes whose centre it
    holds, one of them overlapping it by the drawn IoU, within the scale and aspect bounds; a drawn
    option >= 1 leaves the image; the pixels are torchvision's crop."""
    F = _v2()
    img = _rgb(3, (120, 160)).to(device)
    boxes = np.array([[10, 10, 50, 60], [60, 40, 150, 110], [100, 5, 130, 30], [0, 80, 40, 119]], np.float32)
    aug = A.Compose([A.RandomIoUCrop()])
    cropped = 0
    for k in range(40):
        p = aug.draw([(120, 160)], [k], seed=2, targets=[{"boxes": boxes}])
        s = {key.split(".", 1)[1]: v for key, v in p.samples[0].items()}
        if s["crop"] is None:
            assert s["min_iou"] >= 1.0 and p.size == (120, 160) and s["keep"] is None
            continue
        cropped += 1
        left, top, w, h = s["crop"]
        keep = np.array(s["keep"])
        cx, cy = boxes[:, [0, 2]].mean(1), boxes[:, [1, 3]].mean(1)
        assert keep.any() and (keep == ((left < cx) & (cx < left + w) & (top < cy) & (cy < top + h))).all()
        assert _iou_with(boxes[keep], (left, top, left + w, top + h)).max() >= s["min_iou"]
        assert int(0.3 * 160) <= w <= 160 and int(0.3 * 120) <= h <= 120 and 0.5 <= w / h <= 2
        assert p.size == (h, w) and torch.equal(aug.apply([img], p)[0], F.crop(img.permute(2, 0, 1), top, left, h, w))
    assert 10 < cropped < 40
    # no boxes: torchvision would draw forever; here the image is left as it is
    p = aug.draw([(120, 160)], [0], targets=[{"boxes": np.zeros((0, 4), np.float32)}])
    assert p.samples[0]["RandomIoUCrop.crop"] is None and p.size == (120, 160)


def test_align_faces_batched_fit_is_the_same_whatever_form_the_landmarks_take():
    """AlignFaces fits a batch at once; arrays [5, 2] take a stacked path, other forms (lists,
    tensors, [10] arrays) sample by sample. Every form gives the same matrices, each equal to fitting
    its sample alone, and unusable landmarks (not finite, all coinciding, missing) give None."""
    rng = np.random.default_rng(5)
    arrays = [rng.uniform(10, 200, (5, 2)) for _ in range(12)]
    arrays[3] = np.full((5, 2), np.nan)
    arrays[7] = np.full((5, 2), 42.0)
    tf = A.AlignFaces(112)
    stacked = tf.fit_batch([{"landmarks": a} for a in arrays])
    for form in (lambda a: a.tolist(), torch.from_numpy, lambda a: a.reshape(-1)):
        other = tf.fit_batch([{"landmarks": form(a)} for a in arrays])
        for s, o in zip(stacked, other):
            assert (s is None and o is None) or np.array_equal(s, o)
    assert [k for k, s in enumerate(stacked) if s is None] == [3, 7]
    for a, s in zip(arrays, stacked):
        alone = tf.fit_batch([{"landmarks": a.tolist()}])[0]
        assert (s is None and alone is None) or np.array_equal(s, alone)
    with_missing = tf.fit_batch([{"landmarks": arrays[0]}, {}, None])
    assert np.array_equal(with_missing[0], stacked[0]) and with_missing[1:] == [None, None]
    assert tf.fit_batch([]) == []
