"""orbbec.augment's TrivialAugmentWide and RandAugment: per-sample draws from torchvision's op
spaces, and each op against torchvision.transforms.v2.functional on uint8 photographs given the same
magnitude (bilinear for the geometric ops: the one warp)."""
import numpy as np
import pytest
import torch

from conftest import DEVICES, sample_photos

import orbbec.augment as A
from orbbec.augment._policies import COLOUR_OPS, GEOMETRIC_OPS, op_matrix
from orbbec.warpaffine import warp_affine

SIZE = (96, 128)


def _v2():
    return pytest.importorskip("torchvision.transforms.v2.functional", reason="torchvision is not installed")


def _photos(n, device):
    return [torch.from_numpy(np.ascontiguousarray(sample_photos(SIZE)[i % 4][:, :, ::-1])).to(device)
            for i in range(n)]


def _reference(F, chw, name, magnitude):
    """torchvision's op on a uint8 CHW image, as its _AutoAugmentBase applies it (bilinear)."""
    bilinear = F.InterpolationMode.BILINEAR
    if name == "ShearX":
        return F.affine(chw, 0.0, [0, 0], 1.0, [float(np.degrees(np.arctan(magnitude))), 0.0], bilinear, center=[0, 0])
    if name == "ShearY":
        return F.affine(chw, 0.0, [0, 0], 1.0, [0.0, float(np.degrees(np.arctan(magnitude)))], bilinear, center=[0, 0])
    if name == "TranslateX":
        return F.affine(chw, 0.0, [int(magnitude), 0], 1.0, [0.0, 0.0], bilinear)
    if name == "TranslateY":
        return F.affine(chw, 0.0, [0, int(magnitude)], 1.0, [0.0, 0.0], bilinear)
    if name == "Rotate":
        return F.rotate(chw, magnitude, bilinear)
    colour = {"Brightness": lambda: F.adjust_brightness(chw, 1.0 + magnitude),
              "Color": lambda: F.adjust_saturation(chw, 1.0 + magnitude),
              "Contrast": lambda: F.adjust_contrast(chw, 1.0 + magnitude),
              "Sharpness": lambda: F.adjust_sharpness(chw, 1.0 + magnitude),
              "Posterize": lambda: F.posterize(chw, int(magnitude)),
              "Solarize": lambda: F.solarize(chw, 255.0 * magnitude),
              "AutoContrast": lambda: F.autocontrast(chw),
              "Equalize": lambda: F.equalize(chw),
              "Identity": lambda: chw}
    return colour[name]()


def _check(out, ref, geometric, ops=1):
    """out float [3, H, W] in [0, 1] against ref uint8 after `ops` colour ops: within 2 levels a op
    (torchvision truncates each op's result, and the grey it blends with, to uint8) and 1 a op on
    average; after two ops on 85% of the pixels (ops that threshold or equalise, after another op,
    turn those truncations into jumps: Solarize after Contrast flips pixels across its threshold,
    Equalize after Contrast moves histogram steps by a level). A geometric op: within 1 level on 98%
    of the pixels away from the border."""
    d = ((out * 255).round() - ref.float()).abs()
    if geometric:
        d = d[:, 4:-4, 4:-4]
        assert (d <= 1).float().mean() >= 0.98, (d <= 1).float().mean()
    else:
        within = (d <= 2 * ops).float().mean()
        assert within >= (1.0 if ops == 1 else 0.85) and d.mean() <= ops, (within, d.mean())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("policy", ["TrivialAugmentWide", "RandAugment"])
def test_each_samples_ops_match_torchvision_v2(device, policy):
    """A batch through the policy alone (no other warp): each sample equals torchvision's functional
    ops applied in its drawn order to the uint8 photograph; every op of the space is seen."""
    F = _v2()
    n = 160
    aug = A.Compose([getattr(A, policy)()])
    images = _photos(n, device)
    p = aug.draw([SIZE] * n, list(range(n)), seed=5)
    out = aug.apply(images, p)
    seen = set()
    for k in range(n):
        ref = images[k].permute(2, 0, 1).contiguous()
        ops = p.samples[k][policy + ".ops"]
        geometric = sum(name in GEOMETRIC_OPS for name, _ in ops)
        # A sample's geometric ops run in the one warp, before its colour ops; torchvision resamples
        # once per op, in the drawn order. Compared: samples with colour ops only, or one geometric op.
        if geometric > 1 or (geometric and len([o for o in ops if o[0] != "Identity"]) > 1):
            continue
        for name, magnitude in ops:
            ref = _reference(F, ref, name, magnitude)
            seen.add(name)
        _check(out[k], ref, geometric > 0, ops=len(ops))
    assert len(seen) >= 12, sorted(seen)


@pytest.mark.parametrize("device", DEVICES)
def test_every_op_at_its_extremes_matches_torchvision_v2(device):
    F = _v2()
    img = _photos(1, device)[0]
    chw = img.permute(2, 0, 1).contiguous()
    x = chw.float().unsqueeze(0) / 255
    for name in COLOUR_OPS:
        for magnitude in ([0.0] if name in ("AutoContrast", "Equalize") else
                          [2.0, 4.0, 7.0] if name == "Posterize" else [0.0, 0.3, 1.0] if name == "Solarize" else
                          [-0.99, -0.4, 0.5, 0.99]):
            out = COLOUR_OPS[name](x.clone(), torch.tensor(magnitude).view(1, 1, 1, 1).to(device))[0]
            _check(out, _reference(F, chw, name, magnitude), False)
    for name in GEOMETRIC_OPS:
        for magnitude in ([-0.99, 0.3] if "Shear" in name else [-32.0, 17.0] if "Translate" in name else [-135.0, 20.0]):
            M = torch.tensor(op_matrix(name, magnitude, SIZE)[:2], dtype=torch.float64)[None].to(device)
            out = warp_affine([img], M, (SIZE[1], SIZE[0]), out_dtype=torch.float32, scale=1 / 255, out_layout="NCHW")
            _check(out[0], _reference(F, chw, name, magnitude), True)


def test_draws_are_per_sample_and_follow_the_spaces():
    ta = A.Compose([A.TrivialAugmentWide()]).draw([SIZE] * 400, list(range(400)), seed=2)
    ops = [s["TrivialAugmentWide.ops"] for s in ta.samples]
    assert all(len(o) == 1 for o in ops) and len({o[0][0] for o in ops}) == 14
    rotations = [m for (name, m), in ops if name == "Rotate"]
    assert max(rotations) > 60 and min(rotations) < -60 and max(abs(r) for r in rotations) <= 135
    assert {m for (name, m), in ops if name == "Posterize"} <= {2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0}
    ra = A.Compose([A.RandAugment(num_ops=3, magnitude=30)]).draw([SIZE] * 200, list(range(200)), seed=2)
    for s in ra.samples:
        assert len(s["RandAugment.ops"]) == 3
        for name, m in s["RandAugment.ops"]:  # the last bin: the range's end
            want = {"Rotate": 30.0, "ShearX": 0.3, "ShearY": 0.3, "TranslateX": 150 / 331 * SIZE[1],
                    "TranslateY": 150 / 331 * SIZE[0], "Solarize": 0.0, "Posterize": 4.0}.get(name)
            if want is not None:
                assert abs(abs(m) - want) < 1e-4, (name, m)
    with pytest.raises(ValueError, match="magnitude"):
        A.RandAugment(magnitude=31)
    with pytest.raises(ValueError, match="before"):
        A.Compose([A.TrivialAugmentWide(), A.RandomHorizontalFlip()])


@pytest.mark.parametrize("device", DEVICES)
def test_a_loader_with_a_policy_and_erasing_gives_the_same_batches_whatever_the_workers(device):
    from jpeg_files import encode, photo

    from orbbec.data import GPULoader

    jpegs = [encode(photo(i, (90 + 7 * i, 120))) for i in range(12)]
    tf = A.Compose([A.RandomResizedCrop(64), A.RandomHorizontalFlip(), A.TrivialAugmentWide(),
                    A.Normalize(A.IMAGENET_MEAN, A.IMAGENET_STD), A.RandomErasing(p=0.5, value=9.0)])
    runs = [torch.cat([b.cpu() for b in GPULoader(jpegs, 4, transform=tf, seed=3, device=device, num_workers=w)])
            for w in (0, 2)]
    assert runs[0].shape == (12, 3, 64, 64) and torch.equal(runs[0], runs[1])
    erased = (runs[0] == 9.0).all(dim=1).flatten(1).any(dim=1)  # a pixel 9 in every channel: erased
    assert 0 < int(erased.sum()) < 12


@pytest.mark.parametrize("device", DEVICES)
def test_a_samples_pixels_do_not_depend_on_its_batch(device):
    """The colour ops run on the samples that drew them, batched: a sample comes out bit for bit the
    same in a batch of 24 and alone (the loader's batches shrink when a bad sample is skipped)."""
    aug = A.Compose([A.RandAugment(num_ops=2, magnitude=20), A.Normalize(A.IMAGENET_MEAN, A.IMAGENET_STD)])
    images = _photos(24, device)
    p = aug.draw([SIZE] * 24, list(range(24)), seed=9)
    batch = aug.apply(images, p)
    for k in (0, 5, 17):
        alone = aug.apply([images[k]], aug.draw([SIZE], [k], seed=9))
        assert torch.equal(batch[k], alone[0]), (k, p.samples[k]["RandAugment.ops"])
