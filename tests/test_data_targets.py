"""orbbec.data.GPULoader's targets and inputs: boxes, masks and landmarks follow their image, decoded
images and other formats are accepted; on the CPU path (CI) and the GPU path."""
import os

import numpy as np
import pytest
import torch

from conftest import DEVICES
from jpeg_files import encode, photo
from loader_data import SIZES, JpegDataset, by_index, make_transform

import orbbec.augment as A
from orbbec.data import GPULoader
from orbbec.io import JpegDecodeError


@pytest.mark.parametrize("device", DEVICES)
def test_boxes_follow_the_image(device):
    """Bright squares painted into a photograph at the boxes; after a random affine and flip, each
    kept box of the batch encloses its square again."""
    class Squares(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            img = (photo(i, (200, 240)) // 3).copy()
            boxes = np.array([[40, 50, 80, 90], [150, 100, 190, 150]], np.float32)
            for x0, y0, x1, y1 in boxes.astype(int):
                img[y0:y1, x0:x1] = 255
            return {"image": encode(img, quality=95), "boxes": boxes, "label": i}

    tf = A.Compose([A.RandomAffine(25, (0.1, 0.1), (0.8, 1.1)), A.RandomHorizontalFlip(), A.Resize((200, 240))])
    for b in GPULoader(Squares(), 4, transform=tf, seed=1, device=device):
        img = b["image"].float().mean(1).cpu()  # uint8 NCHW out (no Normalize)
        for k in range(img.shape[0]):
            bright = img[k] > 200
            for box in b["boxes"][k, : int(b["num_boxes"][k])].cpu():
                x0, y0, x1, y1 = box.tolist()
                inside = bright[int(y0):int(np.ceil(y1)), int(x0):int(np.ceil(x1))].sum()
                # the rotated square fills at least half of its enclosing box and nothing bright leaks out
                assert inside >= 0.5 * (x1 - x0) * (y1 - y0) - 2 * (x1 - x0 + y1 - y0)
            mask = torch.zeros_like(bright)
            for box in b["boxes"][k, : int(b["num_boxes"][k])].cpu():
                x0, y0, x1, y1 = box.tolist()
                mask[max(int(y0) - 1, 0):int(np.ceil(y1)) + 1, max(int(x0) - 1, 0):int(np.ceil(x1)) + 1] = True
            assert (bright & ~mask).sum() <= 3


def test_a_batchs_boxes_move_as_each_samples_alone():
    """The batch's boxes in one transform_boxes call, split back by sample: each sample's kept boxes
    and labels are those of its boxes moved alone, with samples that have no boxes, lose all or some
    of them (out of the image, or below box_min_visible) among the others."""
    from orbbec.augment import transform_boxes
    from orbbec.data._samples import _move_boxes

    rng = np.random.default_rng(2)
    targets, M = [], []
    for i in range(12):
        n = [0, 3, 7, 1][i % 4]
        xy = rng.uniform(-60, 200, (n, 2))
        targets.append({"boxes": np.concatenate([xy, xy + rng.uniform(4, 80, (n, 2))], 1).astype(np.float32),
                        "labels": np.arange(n) + 10 * i})
        p = A.Compose([A.RandomAffine(40, (0.3, 0.3), (0.5, 1.5))]).draw([(160, 200)], [i], seed=8)
        M.append(p.matrices[0])
    moved = [dict(t) for t in targets]
    _move_boxes(moved, torch.stack(M), (160, 200), 0.3)
    outcomes = set()
    for t, m, got in zip(targets, M, moved):
        want, kept = transform_boxes(torch.as_tensor(t["boxes"]).reshape(-1, 4), m, (160, 200), 0.3)
        assert torch.equal(torch.as_tensor(got["boxes"]), want)
        assert torch.equal(torch.as_tensor(got["labels"]), torch.as_tensor(t["labels"])[kept])
        outcomes.add("none given" if len(kept) == 0 else "all kept" if kept.all() else
                     "all lost" if not kept.any() else "some lost")
    assert outcomes == {"none given", "all kept", "all lost", "some lost"}


@pytest.mark.parametrize("device", DEVICES)
def test_ssd_recipe_drops_the_boxes_its_iou_crop_leaves_out_with_their_labels(device):
    """RandomZoomOut, RandomIoUCrop, flip, Resize, RandomPhotometricDistort (torchvision's SSD recipe,
    the colour after the geometry as Compose orders it) through the loader: each sample keeps the
    boxes (and labels) whose centre its crop holds, moved by its matrix; samples the crop left alone
    keep all of theirs."""
    from orbbec.augment import transform_boxes

    tf = A.Compose([A.RandomZoomOut(side_range=(1.0, 2.0)), A.RandomIoUCrop(), A.RandomHorizontalFlip(),
                    A.Resize((96, 128)), A.RandomPhotometricDistort(), A.Normalize(A.IMAGENET_MEAN, A.IMAGENET_STD)])
    ds = JpegDataset(16)
    items = [ds[i] for i in range(16)]
    dropped = 0
    for b in GPULoader(items, 8, transform=tf, seed=4, device=device, return_params=True):
        for k, i in enumerate(b["label"].tolist()):
            sample = b["params"].samples[k]
            boxes = torch.as_tensor(items[i]["boxes"]).reshape(-1, 4)
            labels = torch.as_tensor(items[i]["labels"])
            keep = sample["RandomIoUCrop.keep"]
            if keep is not None:
                mask = torch.tensor(keep)
                dropped += int((~mask).sum())
                boxes, labels = boxes[mask], labels[mask]
            want, kept = transform_boxes(boxes, b["params"].matrices[k], (96, 128))
            n = int(b["num_boxes"][k])
            assert n == len(want) and torch.allclose(b["boxes"][k, :n].cpu(), want), (i, sample)
            assert torch.equal(b["labels"][k, :n].cpu(), labels[kept])
    assert dropped > 0


class _Segmented(torch.utils.data.Dataset):
    """Two bright squares painted into a darkened photograph, with their boxes, a semantic "mask"
    (label 1 and 2 on the squares) and instance "masks" (one bool mask per box)."""
    boxes = np.array([[40, 50, 90, 100], [150, 100, 200, 160]], np.float32)

    def __len__(self):
        return 8

    def __getitem__(self, i):
        img = (photo(i, (200, 240)) // 3).copy()
        mask = np.zeros((200, 240), np.uint8)
        for label, (x0, y0, x1, y1) in enumerate(self.boxes.astype(int), start=1):
            img[y0:y1, x0:x1] = 255
            mask[y0:y1, x0:x1] = label
        return {"image": encode(img, quality=95), "boxes": self.boxes, "labels": np.array([1, 2]), "mask": mask,
                "masks": np.stack([mask == 1, mask == 2]), "label": i}


@pytest.mark.parametrize("device", DEVICES)
def test_masks_follow_the_image_nearest_and_drop_with_their_boxes(device):
    """A semantic mask and per-box instance masks, warped by each sample's matrix (nearest): the
    labelled pixels are the squares' bright pixels in the warped image, each instance mask is its
    label's region of the semantic one, and a box a crop drops takes its mask along."""
    tf = A.Compose([A.RandomAffine(25, (0.1, 0.1), (0.8, 1.1)), A.RandomHorizontalFlip(), A.RandomIoUCrop(),
                    A.Resize((160, 192))])
    dropped = 0
    for b in GPULoader(_Segmented(), 4, transform=tf, seed=3, device=device):
        assert b["mask"].shape == (4, 160, 192) and b["mask"].dtype == torch.uint8
        bright = b["image"].float().mean(1).cpu() > 200
        for k in range(4):
            mask, n = b["mask"][k].cpu(), int(b["num_boxes"][k])
            labelled = mask > 0
            agree = (labelled & bright[k]).sum() / (labelled | bright[k]).sum().clamp(min=1)
            assert agree > 0.9, (k, float(agree))
            masks = b["masks"][k, :n].cpu()
            assert masks.dtype == torch.bool and masks.shape == (n, 160, 192)
            for j in range(n):
                assert torch.equal(masks[j], mask == int(b["labels"][k, j]))
            dropped += 2 - n
    assert dropped > 0  # some crop left a square out
    items = [_Segmented()[i] for i in range(4)]
    items[2]["mask"] = items[2]["mask"][:, :200]
    with pytest.raises(ValueError, match=r"sample 2: 'mask' is \(200, 200\), its image \(200, 240\)"):
        list(GPULoader(items, 4, transform=tf, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_an_image_without_boxes_batches_with_empty_instance_masks(device):
    """An image with no objects (boxes [0, 4], labels [0], instance masks [0, H, W], as COCO has)
    batches with the others: no boxes, its masks all padding, the other samples as without it."""
    tf = A.Compose([A.RandomAffine(25, (0.1, 0.1), (0.8, 1.1)), A.Resize((160, 192))])
    items = [_Segmented()[i] for i in range(4)]
    items[1].update(boxes=np.zeros((0, 4), np.float32), labels=np.zeros(0, np.int64),
                    masks=np.zeros((0, 200, 240), bool))
    got = next(iter(GPULoader(items, 4, transform=tf, seed=5, device=device)))
    full = next(iter(GPULoader([_Segmented()[i] for i in range(4)], 4, transform=tf, seed=5, device=device)))
    assert int(got["num_boxes"][1]) == 0 and int(full["num_boxes"][1]) > 0
    assert got["masks"].shape == full["masks"].shape and not got["masks"][1].any()
    for k in (0, 2, 3):
        for key in ("boxes", "labels", "masks", "mask"):
            assert torch.equal(got[key][k], full[key][k]), (k, key)


@pytest.mark.parametrize("device", DEVICES)
def test_decoded_images_and_tuples_are_accepted(device):
    imgs = [torch.from_numpy(photo(i, SIZES[i % 4])[:, :, ::-1].copy()) for i in range(6)]
    ds = [(img, i) for i, img in enumerate(imgs)]
    tf = A.Compose([A.CenterCrop(64)])
    out, labels = next(iter(GPULoader(ds, 6, transform=tf, device=device)))
    assert labels.tolist() == list(range(6)) and out.shape == (6, 3, 64, 64) and out.dtype == torch.uint8
    h, w = SIZES[1]
    top, left = int(round((h - 64) / 2)), int(round((w - 64) / 2))
    assert torch.equal(out[1].cpu().permute(1, 2, 0), imgs[1][top:top + 64, left:left + 64])
    # without a transform: the decoded images as a list
    plain = next(iter(GPULoader([encode(photo(0, (50, 70)))] * 3, 3, device=device)))
    assert isinstance(plain, list) and len(plain) == 3 and plain[0].shape == (50, 70, 3)


def _other_formats(tmp_path):
    """{name: (encoded file or its path, its pixels as OpenCV decodes them, BGR)} in lossless
    formats other than JPEG, each from another photograph and size."""
    import cv2

    out = {}
    for k, (name, ext, params) in enumerate([("png", ".png", []), ("bmp", ".bmp", []), ("tiff", ".tiff", []),
                                             ("webp", ".webp", [cv2.IMWRITE_WEBP_QUALITY, 101]),
                                             ("png-grey", ".png", []), ("png-alpha", ".png", []),
                                             ("png-path", ".png", [])]):
        bgr = photo(k, SIZES[k % 4])
        img = bgr
        if name == "png-grey":
            img = cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY)
            bgr = cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
        elif name == "png-alpha":
            img = np.dstack([bgr, np.arange(bgr.shape[0] * bgr.shape[1], dtype=np.uint32).reshape(bgr.shape[:2]) % 256])
            img = img.astype(np.uint8)
        ok, buf = cv2.imencode(ext, img, params)
        assert ok, name
        data = buf.tobytes()
        if name == "png-path":
            (tmp_path / "photo.png").write_bytes(data)
            data = str(tmp_path / "photo.png")
        out[name] = (data, bgr)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("workers,mode", [(0, "RGB"), (2, "BGR")])
def test_images_in_other_formats_are_decoded_in_the_workers(device, workers, mode, tmp_path):
    """PNG (colour, grey, with alpha), BMP, TIFF and lossless WebP files, as bytes and as a path,
    between JPEGs in the same batches: each sample comes out as its pixels given decoded would (the
    same draw, bit for bit), its boxes moved alike; a file that is no image raises naming its sample."""
    others = _other_formats(tmp_path)
    jpegs = JpegDataset(2 * len(others) + 1)
    as_files, as_pixels = [], []
    for i in range(len(jpegs)):
        item = jpegs[i]
        if i % 2 == 1 and others:  # every other sample in another format
            data, bgr = others.pop(sorted(others)[0])
            h, w = bgr.shape[:2]
            item = dict(item, image=data, boxes=np.array([[3, 4, w // 2, h // 2]], np.float32), labels=np.array([1]))
            pixels = bgr if mode == "BGR" else bgr[:, :, ::-1]
            as_pixels.append(dict(item, image=torch.from_numpy(np.ascontiguousarray(pixels))))
        else:
            as_pixels.append(item)  # JPEGs on both sides
        as_files.append(item)
    assert not others
    make = lambda ds, **kw: GPULoader(ds, 4, transform=make_transform(), shuffle=True, seed=4, device=device,
                                      num_workers=workers, mode=mode, **kw)
    got, want = by_index(make(as_files)), by_index(make(as_pixels))
    assert sorted(got) == sorted(want) == list(range(len(as_files)))
    for i in got:
        assert torch.equal(got[i][0], want[i][0]) and torch.equal(got[i][1], want[i][1]), i
    as_files[3] = dict(as_files[3], image=b"\x00\x01 not an image at all")
    with pytest.raises(JpegDecodeError, match="sample 3 .*neither a JPEG nor an image"):
        list(make(as_files))
    ld = make(as_files, on_error="skip")
    kept = by_index(ld)
    assert ld.skipped == [3] and sorted(kept) == sorted(set(got) - {3})
    for i in kept:
        assert torch.equal(kept[i][0], got[i][0]), i


@pytest.mark.parametrize("device", DEVICES)
def test_torchvision_image_folder_with_read_file_as_its_loader(device, tmp_path):
    """torchvision.datasets.ImageFolder(root, loader=orbbec.io.read_file) is a dataset of (bytes,
    class index): the loader takes it as it is, a PNG under a .JPEG name included (as in ImageNet),
    and gives each sample's class and the pixels the same sample given decoded gives."""
    import cv2
    from conftest import torchvision_or_skip
    from orbbec.io import read_file

    torchvision_or_skip()
    from torchvision.datasets import ImageFolder

    pixels = {}
    for i in range(7):
        cls = ("cat", "dog")[i % 2]
        os.makedirs(tmp_path / cls, exist_ok=True)
        bgr = photo(i, SIZES[i % 4])
        name = tmp_path / cls / f"{i}.JPEG"
        name.write_bytes(cv2.imencode(".png", bgr)[1].tobytes() if i == 3 else encode(bgr, quality=95))
        pixels[str(name)] = cv2.imdecode(np.frombuffer(name.read_bytes(), np.uint8), cv2.IMREAD_COLOR)[:, :, ::-1]
    folder = ImageFolder(str(tmp_path), loader=read_file)
    decoded = [(torch.from_numpy(pixels[path].copy()), cls) for path, cls in folder.samples]
    make = lambda ds: GPULoader(ds, 3, transform=make_transform(), shuffle=True, seed=6, device=device, num_workers=2)
    got, want = list(make(folder)), list(make(decoded))
    assert torch.equal(torch.cat([b[1] for b in got]), torch.cat([b[1] for b in want]))
    assert sorted(torch.cat([b[1] for b in got]).tolist()) == sorted(folder.targets) == [0, 0, 0, 0, 1, 1, 1]
    level = 1 / (255 * min(A.IMAGENET_STD))  # one level of 255 after Normalize
    for (x, _), (y, _) in zip(got, want):
        if device == "cpu":
            assert torch.equal(x, y)
        else:  # nvJPEG's pixels differ from OpenCV's by a few levels (more at sharp colour edges)
            diff = (x - y).abs().double().cpu().numpy()
            assert diff.mean() < 1.5 * level and np.percentile(diff, 99) < 8 * level, diff.mean() / level


@pytest.mark.parametrize("device", DEVICES)
def test_face_alignment_matches_align_faces_and_a_bad_face_keeps_the_others(device):
    from orbbec.io import decode_jpeg
    from orbbec.warpaffine import align_faces, arcface_template

    rng = np.random.default_rng(0)
    items = []
    for i in range(6):
        ang, s = rng.uniform(-0.3, 0.3), rng.uniform(1.2, 1.6)
        R = s * np.array([[np.cos(ang), -np.sin(ang)], [np.sin(ang), np.cos(ang)]])
        lm = arcface_template(112).numpy() @ R.T + rng.uniform(20, 60, 2)
        items.append({"image": encode(photo(i, (250, 250)), quality=95), "landmarks": lm.astype(np.float32)})
    items[2]["landmarks"] = np.full((5, 2), np.nan, np.float32)
    tf = A.Compose([A.AlignFaces(112)])
    b = next(iter(GPULoader(items, 6, transform=tf, device=device, return_params=True)))
    assert [s["AlignFaces.valid"] for s in b["params"].samples] == [True, True, False, True, True, True]
    for k in (0, 1, 3, 4, 5):
        img = decode_jpeg(items[k]["image"], device=device).permute(2, 0, 1)[None]
        ref = align_faces(img, torch.from_numpy(items[k]["landmarks"]).double()[None].to(device), 112)
        assert torch.equal(b["image"][k].to(device), ref[0])
        # the landmarks land on the template
        assert torch.allclose(b["landmarks"][k].double().cpu(), arcface_template(112), atol=1e-3)

