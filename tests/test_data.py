"""orbbec.data.GPULoader: batches that depend on (seed, epoch, index) only (0/2/4 workers, world size
1 and 2), resume mid-epoch, corrupt files, targets that follow the image, decoded inputs; on the CPU
path (CI) and the GPU path."""
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from conftest import CHECKOUT_PATH, DEVICES, HAS_CUDA
from jpeg_files import encode, photo, with_frame_size

import orbbec.augment as A
from orbbec.data import GPULoader
from orbbec.io import JpegDecodeError

SIZES = [(120, 160), (150, 150), (96, 200), (180, 140)]


class JpegDataset(torch.utils.data.Dataset):
    """Real photographs as JPEG bytes, a label and (per sample a different number of) boxes; `bad`
    indices hold a truncated file."""

    def __init__(self, n=22, bad=()):
        self.n, self.bad = n, set(bad)
        self.jpegs = [encode(photo(i, SIZES[i % 4]), quality=92) for i in range(n)]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        h, w = SIZES[i % 4]
        boxes = np.array([[5, 6, w // 2, h // 2], [w // 3, h // 4, w - 4, h - 3], [1, 1, 9, 9]], np.float32)[: 1 + i % 3]
        data = self.jpegs[i][: len(self.jpegs[i]) // 2] if i in self.bad else self.jpegs[i]
        return {"image": data, "boxes": boxes, "labels": np.arange(len(boxes)) + 10, "label": i}


def _transform(colour=True):
    ts = [A.RandomResizedCrop(48, scale=(0.3, 1.0)), A.RandomHorizontalFlip()]
    if colour:
        ts.append(A.ColorJitter(0.3, 0.3, 0.3, 0.05))
    return A.Compose(ts + [A.Normalize(A.IMAGENET_MEAN, A.IMAGENET_STD)])


def _by_index(loader):
    """{dataset index (the 'label'): (image, boxes) of that sample} over one epoch."""
    out = {}
    for b in loader:
        for k, label in enumerate(b["label"].tolist()):
            out[label] = (b["image"][k].cpu(), b["boxes"][k, : int(b["num_boxes"][k])].cpu())
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_same_seed_same_batches_whatever_the_workers(device):
    ds = JpegDataset()
    runs = [_by_index(GPULoader(ds, 5, transform=_transform(), shuffle=True, num_workers=w, seed=7, device=device))
            for w in (0, 2, 4)]
    assert sorted(runs[0]) == list(range(len(ds)))
    for other in runs[1:]:
        for i in runs[0]:
            assert torch.equal(runs[0][i][0], other[i][0]) and torch.equal(runs[0][i][1], other[i][1])
    # another seed or another epoch: other parameters
    other_seed = _by_index(GPULoader(ds, 5, transform=_transform(), seed=8, device=device))
    assert sum(not torch.equal(runs[0][i][0], other_seed[i][0]) for i in runs[0]) > len(ds) // 2


@pytest.mark.parametrize("device", DEVICES)
def test_a_batch_is_cv2s_decode_warp_and_normalise_with_the_drawn_matrices(device):
    """End to end against an independent reference: each sample of a batch equals cv2.imdecode, then
    cv2.warpAffine in float32 with the sample's drawn matrix (bilinear, zero border; the fused warp
    does not round to uint8 before normalising), RGB, /255, (x - mean) / std. On the CPU within 2% of
    one level of 255 (float arithmetic); on the GPU nvJPEG's pixels differ from libjpeg-turbo's by a
    few levels."""
    import cv2

    sizes = [(150 + 29 * i, 190 + 41 * (i % 3)) for i in range(10)]
    jpegs = [encode(photo(i, hw), quality=90) for i, hw in enumerate(sizes)]
    mean, std = np.array(A.IMAGENET_MEAN), np.array(A.IMAGENET_STD)
    tf = A.Compose([A.RandomAffine(20, (0.1, 0.1), (0.7, 1.3), shear=8), A.RandomHorizontalFlip(),
                    A.Resize((96, 128)), A.Normalize(A.IMAGENET_MEAN, A.IMAGENET_STD)])
    level = 1 / (255 * std.min())  # one level of 255 after Normalize
    seen = 0
    for b, (images, params) in enumerate(GPULoader(jpegs, 5, transform=tf, seed=11, device=device,
                                                   return_params=True)):
        assert images.shape == (5, 3, 96, 128) and images.dtype == torch.float32
        for k in range(images.shape[0]):
            src = cv2.imdecode(np.frombuffer(jpegs[5 * b + k], np.uint8), cv2.IMREAD_COLOR)
            warped = cv2.warpAffine(src.astype(np.float32), params.matrices[k].numpy(), (128, 96),
                                    flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=0)
            want = ((warped[:, :, ::-1] / 255.0 - mean) / std).transpose(2, 0, 1)
            diff = np.abs(images[k].double().cpu().numpy() - want)
            if device == "cpu":
                assert diff.max() < 0.02 * level, (b, k, diff.max() / level)
            else:
                assert diff.mean() < 1.5 * level and np.percentile(diff, 99) < 8 * level, (b, k, diff.mean())
            seen += 1
    assert seen == len(jpegs)


@pytest.mark.parametrize("device", DEVICES)
def test_batches_are_the_shuffled_order_and_epochs_differ(device):
    ds = JpegDataset(12)
    ld = GPULoader(ds, 4, transform=_transform(False), shuffle=True, seed=3, device=device)
    first = [b["label"].tolist() for b in ld]
    second = [b["label"].tolist() for b in ld]  # the loader moved to epoch 1 by itself
    g = torch.Generator()
    g.manual_seed(3)
    order = torch.randperm(12, generator=g).tolist()
    assert sum(first, []) == order and sorted(sum(second, [])) == list(range(12)) and first != second
    assert ld.epoch == 2 and len(ld) == 3


@pytest.mark.parametrize("device", DEVICES)
def test_the_next_epoch_read_ahead_is_the_one_asked_for(device):
    """On the GPU the loader's threads go on into the next epoch while this one is consumed; what is
    served is still exactly the epoch (and seed) asked for: the next one, one set by set_epoch, or
    one after the seed changed. Each is compared with a fresh loader's."""
    ds = JpegDataset(12)
    make = lambda seed: GPULoader(ds, 4, transform=_transform(), shuffle=True, seed=seed, device=device, num_workers=2)

    def fresh(epoch, seed=3):
        ld = make(seed)
        ld.set_epoch(epoch)
        return list(ld)

    def same(a, b):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert torch.equal(x["label"], y["label"]) and torch.equal(x["image"], y["image"])

    ld = make(3)
    first = list(ld)
    threads = ld._batches
    second = list(ld)  # epoch 1, read ahead during epoch 0
    if device != "cpu":
        assert threads is not None and ld._batches is threads, "the threads did not go on into the next epoch"
    ld.set_epoch(5)
    fifth = list(ld)
    ld.seed = 4
    ld.set_epoch(0)
    reseeded = list(ld)
    same(first, fresh(0))
    same(second, fresh(1))
    same(fifth, fresh(5))
    same(reseeded, fresh(0, seed=4))
    assert not torch.equal(first[0]["label"], second[0]["label"]) or not torch.equal(first[1]["label"], second[1]["label"])


@pytest.mark.skipif(not HAS_CUDA, reason="the warp in the GPU decoder's thread needs CUDA")
@pytest.mark.parametrize("colour", [False, True])
def test_the_warp_in_the_decoders_thread_is_compose_apply(colour, monkeypatch):
    """The loader warps each batch in the GPU decoder's thread (the decoded images never reach
    Python); its batches are bit for bit Compose.apply's on decode_jpeg's images (of every row) with
    the same drawn parameters, with and without a photometric transform after the warp, while it
    decodes many of the JPEGs only down to the rows the warp reads (partial_decode)."""
    from orbbec.data import _samples, _stages
    from orbbec.io import decode_jpeg

    real, used = _stages.start_batch_decode, []
    real_rows, cut = _samples.rows_to_decode, []

    def counting(data, warp=None, **kwargs):
        used.append(warp is not None)  # the batch is warped in the decoder's thread
        return real(data, warp, **kwargs)

    def counting_rows(*args):
        rows = real_rows(*args)
        cut.extend(r is not None for r in rows)
        return rows
    monkeypatch.setattr(_stages, "start_batch_decode", counting)
    monkeypatch.setattr(_samples, "rows_to_decode", counting_rows)
    ds = JpegDataset(10)
    tf = _transform(colour)
    for b in GPULoader(ds, 5, transform=tf, shuffle=True, seed=4, device="cuda", return_params=True):
        labels = b["label"].tolist()
        want = tf.apply(decode_jpeg([ds.jpegs[i] for i in labels], device="cuda"), b["params"])
        assert torch.equal(b["image"], want)
    assert sum(used) >= 2  # (and the next epoch's, read ahead)
    assert sum(cut) >= len(cut) // 4, (sum(cut), len(cut))


@pytest.mark.parametrize("device", DEVICES)
def test_resume_mid_epoch_gives_the_rest_of_the_epoch(device):
    ds = JpegDataset(20)
    make = lambda: GPULoader(ds, 3, transform=_transform(), shuffle=True, seed=5, device=device, num_workers=2)
    full = [b for b in make()]
    ld = make()
    it = iter(ld)
    head = [next(it) for _ in range(3)]
    state = ld.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(state)
    tail = list(resumed)
    assert state == {"epoch": 0, "batches_served": 3, "seed": 5}
    assert len(head) + len(tail) == len(full)
    for a, b in zip(head + tail, full):
        assert torch.equal(a["label"], b["label"]) and torch.equal(a["image"], b["image"])
    assert resumed.epoch == 1


class _SlowAt(JpegDataset):
    """JpegDataset whose samples in `slow` take half a second to read (their worker falls behind)
    and whose samples in `fail` raise."""

    def __init__(self, slow=(), fail=()):
        super().__init__()
        self.slow, self.fail = set(slow), set(fail)

    def __getitem__(self, i):
        if i in self.slow:
            time.sleep(0.5)
        if i in self.fail:
            raise ValueError(f"unreadable sample {i}")
        return super().__getitem__(i)


def _labels_and_images(loader, epochs=(0,)):
    out = []
    for e in epochs:
        loader.set_epoch(e)
        out += [(b["label"].tolist(), b["image"].cpu()) for b in loader]
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_a_late_worker_changes_neither_the_batches_nor_their_order(device):
    """Two samples are slow to read, so their workers fall behind the others: the batches of two
    epochs, and their order, are those of the loader without workers."""
    make = lambda ds, w: GPULoader(ds, 3, transform=_transform(), shuffle=True, num_workers=w, seed=4, device=device)
    want = _labels_and_images(make(JpegDataset(), 0), (0, 1))
    got = _labels_and_images(make(_SlowAt(slow=[2, 11]), 4), (0, 1))
    assert [labels for labels, _ in got] == [labels for labels, _ in want]
    for (labels, a), (_, b) in zip(got, want):
        assert torch.equal(a, b), labels


@pytest.mark.parametrize("device", DEVICES)
def test_an_error_comes_after_every_batch_before_it(device):
    """A sample that raises in the dataset, with an earlier batch late: every batch before the
    failing one is handed out first, then its error."""
    make = lambda ds, w: GPULoader(ds, 3, transform=_transform(), shuffle=True, num_workers=w, seed=4, device=device)
    order = [labels for labels, _ in _labels_and_images(make(JpegDataset(), 0))]
    fail, slow = order[4][1], order[2][0]
    got = []
    with pytest.raises(ValueError, match=f"unreadable sample {fail}"):
        for b in make(_SlowAt(slow=[slow], fail=[fail]), 3):
            got.append(b["label"].tolist())
    assert got == order[:4]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("workers", [0, 2])
def test_corrupt_jpeg_raises_naming_the_sample_or_is_skipped(device, workers):
    good = _by_index(GPULoader(JpegDataset(), 6, transform=_transform(), seed=2, device=device))
    with pytest.raises(JpegDecodeError, match="sample 9"):
        list(GPULoader(JpegDataset(bad=[9]), 6, transform=_transform(), seed=2, device=device, num_workers=workers))
    ld = GPULoader(JpegDataset(bad=[9, 13]), 6, transform=_transform(), seed=2, device=device, on_error="skip",
                   num_workers=workers)
    kept = _by_index(ld)
    assert sorted(ld.skipped) == [9, 13] and sorted(kept) == sorted(set(good) - {9, 13})
    for i in kept:  # the other samples of those batches are untouched
        assert torch.equal(kept[i][0], good[i][0]) and torch.equal(kept[i][1], good[i][1])


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
    make = lambda ds, **kw: GPULoader(ds, 4, transform=_transform(), shuffle=True, seed=4, device=device,
                                      num_workers=workers, mode=mode, **kw)
    got, want = _by_index(make(as_files)), _by_index(make(as_pixels))
    assert sorted(got) == sorted(want) == list(range(len(as_files)))
    for i in got:
        assert torch.equal(got[i][0], want[i][0]) and torch.equal(got[i][1], want[i][1]), i
    as_files[3] = dict(as_files[3], image=b"\x00\x01 not an image at all")
    with pytest.raises(JpegDecodeError, match="sample 3 .*neither a JPEG nor an image"):
        list(make(as_files))
    ld = make(as_files, on_error="skip")
    kept = _by_index(ld)
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
    make = lambda ds: GPULoader(ds, 3, transform=_transform(), shuffle=True, seed=6, device=device, num_workers=2)
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


_RANK_SCRIPT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    sys.path[:0] = {paths!r}
    import test_data as T
    from orbbec.data import GPULoader
    dist.init_process_group("gloo")
    ld = GPULoader(T.JpegDataset(), 4, transform=T._transform(), shuffle=True, seed=9, device="cpu", num_workers=1)
    seen = T._by_index(ld)
    torch.save({{"rank": dist.get_rank(), "seen": seen}}, os.environ["OUT"])
    dist.destroy_process_group()
""")


def test_two_processes_shard_the_dataset_and_draw_the_same_parameters(tmp_path):
    """World size 2 (gloo, CPU): disjoint shards as DistributedSampler makes them, covering the
    dataset, and each sample identical to a world-size-1 run."""
    script = tmp_path / "rank.py"
    here = os.path.dirname(os.path.abspath(__file__))
    script.write_text(_RANK_SCRIPT.format(paths=[here] + CHECKOUT_PATH))  # the orbbec the tests use
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(29500 + os.getpid() % 1000), OUT=str(tmp_path / f"r{rank}.pt"))
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env))
    assert all(p.wait(timeout=300) == 0 for p in procs)
    shards = [torch.load(tmp_path / f"r{r}.pt")["seen"] for r in range(2)]
    ds = JpegDataset()
    sampler_shards = [set(torch.utils.data.DistributedSampler(ds, 2, r, shuffle=True, seed=9)) for r in range(2)]
    assert [set(s) for s in shards] == sampler_shards  # 22 samples: 11 per rank, disjoint
    assert not set(shards[0]) & set(shards[1]) and set(shards[0]) | set(shards[1]) == set(range(len(ds)))
    single = _by_index(GPULoader(ds, 4, transform=_transform(), shuffle=True, seed=9, device="cpu",
                                 rank=0, world_size=1))
    for shard in shards:
        for i, (img, boxes) in shard.items():
            assert torch.equal(img, single[i][0]) and torch.equal(boxes, single[i][1])


@pytest.mark.parametrize("device", DEVICES)
def test_a_script_ending_with_its_loader_reading_ahead_exits_cleanly(tmp_path, device):
    """A training script that ends after its last epoch while the loader's threads still read the
    next one: the process exits with status 0 (it once aborted while a thread waited for the GPU
    decoder at interpreter exit)."""
    script = tmp_path / "ends.py"
    here = os.path.dirname(os.path.abspath(__file__))
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path[:0] = {[here] + CHECKOUT_PATH!r}
        from test_data import JpegDataset, _transform
        from orbbec.data import GPULoader
        loader = GPULoader(JpegDataset(12), 4, transform=_transform(), shuffle=True, num_workers=2,
                           device={device!r})
        for epoch in range(2):
            for batch in loader:
                pass
        print("done", flush=True)
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr[-2000:]
    assert "terminate called" not in r.stderr


BAD_IMAGES = {
    "decoded, 4 channels": np.full((40, 50, 4), 7, np.uint8),
    "decoded, no rows": np.zeros((0, 50, 3), np.uint8),
    "decoded, 2-D": np.zeros((40, 50), np.uint8),
    "empty bytes": b"",
    "header of 65500 x 65500": "huge",
}

BAD_TARGETS = {
    "boxes": (np.ones((2, 5), np.float32), "'boxes' must be \\[N, 4\\]"),
    "labels": (np.arange(7), "'labels' must hold one value per box"),
    "keypoints": (np.ones(4, np.float32), "'keypoints' must be \\[K, 2\\]"),
    "landmarks": (np.ones((4, 2), np.float32), "'landmarks' must be \\[5, 2\\]"),
}


@pytest.mark.parametrize("device", DEVICES)
def test_bad_items_name_their_sample_and_keep_the_others(device):
    """An unusable image (a decoded array of the wrong shape, no bytes, a frame header past what a
    decoder takes) raises naming its sample, or is skipped with the batch's other samples intact;
    targets of the wrong shape raise naming the sample and the key whatever on_error says (a mistake
    in the dataset's code is not a file to skip)."""
    make = lambda ds, **kw: GPULoader(ds, 6, transform=_transform(), seed=2, device=device, **kw)
    good = _by_index(make(JpegDataset()))
    for name, image in BAD_IMAGES.items():
        ds = JpegDataset()
        bad = [ds[i] for i in range(len(ds))]
        huge = isinstance(image, str)
        bad[5]["image"] = with_frame_size(bad[5]["image"], 65500, 65500) if huge else image
        with pytest.raises(JpegDecodeError, match="sample 5 "):
            list(make(bad))
        ld = make(bad, on_error="skip")
        kept = _by_index(ld)
        assert ld.skipped == [5] and sorted(kept) == sorted(set(good) - {5}), name
        for i in kept:
            assert torch.equal(kept[i][0], good[i][0]) and torch.equal(kept[i][1], good[i][1]), (name, i)
    for key, (value, message) in BAD_TARGETS.items():
        ds = JpegDataset()
        items = [ds[i] for i in range(len(ds))]
        items[5][key] = value
        for on_error in ("raise", "skip"):
            with pytest.raises(ValueError, match=f"sample 5: {message}"):
                list(make(items, on_error=on_error))


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes need Python 3.11")
@pytest.mark.parametrize("workers", [0, 2])
def test_an_exception_of_the_dataset_says_which_sample_raised_it(workers):
    class Missing(JpegDataset):
        def __getitem__(self, i):
            if i == 7:
                raise FileNotFoundError(f"no file for {i}")
            return super().__getitem__(i)

    with pytest.raises(FileNotFoundError) as err:
        list(GPULoader(Missing(), 4, transform=_transform(), device="cpu", num_workers=workers))
    said = str(err.value) + " ".join(getattr(err.value, "__notes__", []))
    assert "no file for 7" in said and "GPULoader: raised by dataset[7]" in said


_WORKER_TAG = None


def _tag_worker(worker_id):
    global _WORKER_TAG
    _WORKER_TAG = 100 + worker_id


class _TaggedByWorker(JpegDataset):
    """(JPEG, the tag its worker_init_fn set): what a dataset opening a per-worker handle sees."""

    def __getitem__(self, i):
        return self.jpegs[i], _WORKER_TAG


@pytest.mark.parametrize("device", DEVICES)
def test_dataloaders_arguments_are_taken(device):
    """A DataLoader call's arguments keep working: worker_init_fn runs in each worker before it
    reads, pin_memory, persistent_workers, prefetch_factor, timeout and multiprocessing_context are
    taken; collate_fn, batch_sampler and generator raise saying what to use instead."""
    ld = GPULoader(_TaggedByWorker(12), 3, transform=_transform(), device=device, num_workers=2,
                   worker_init_fn=_tag_worker, pin_memory=True, persistent_workers=True, prefetch_factor=3,
                   timeout=120, multiprocessing_context="fork")
    tags = torch.cat([tag for _, tag in ld]).tolist()
    assert len(tags) == 12 and set(tags) <= {100, 101} and ld._reader.prefetch_factor == 3
    for name, value, says in [("collate_fn", lambda b: b, "ragged="), ("batch_sampler", [[0, 1]], "batch_size"),
                              ("generator", torch.Generator(), "seed=")]:
        with pytest.raises(TypeError, match=f"{name} is DataLoader's.*{says}"):
            GPULoader(JpegDataset(4), 2, device=device, **{name: value})


def test_arguments_are_checked():
    ds = JpegDataset(4)
    with pytest.raises(ValueError, match="batch_size"):
        GPULoader(ds, 0)
    with pytest.raises(ValueError, match="on_error"):
        GPULoader(ds, 2, on_error="ignore")
    with pytest.raises(ValueError, match="rank"):
        GPULoader(ds, 2, rank=2, world_size=2)
    with pytest.raises(ValueError, match="exclusive"):
        GPULoader(ds, 2, shuffle=True, sampler=range(4))

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(ds.jpegs)

    for not_map_style in (Stream(), iter(ds.jpegs)):
        with pytest.raises(TypeError, match="dataset must be map-style"):
            GPULoader(not_map_style, 2)


def test_packed_bytes_round_trip():
    """Workers of the GPU path hand the encoded bytes over as one tensor: nothing lost or shifted."""
    from orbbec.data._samples import prepare

    ds = JpegDataset(7, bad=[2])
    ds.jpegs[4] = b"not a jpeg"
    batch = prepare(ds, list(range(7)), transform=_transform(), seed=0, epoch=0, box_min_visible=0.0,
                    flip_pairs=None, ragged="padded")
    before = [None if e is None else bytes(e) for e in batch.encoded]
    batch.pack()
    after = [None if e is None else e.tobytes() for e in batch.buffers()]
    assert after == before and before[4] is None and before[0] == ds.jpegs[0]
    # Rows cut short: the packed copy carries the cut headers, the dataset's bytes stay whole.
    ds = JpegDataset(8)
    whole = [bytes(j) for j in ds.jpegs]
    batch = prepare(ds, list(range(8)), transform=_transform(), seed=0, epoch=0, box_min_visible=0.0,
                    flip_pairs=None, ragged="padded", partial_decode=True)
    cut = [bytes(b) for b in batch.buffers()]
    batch.pack()
    assert [b.tobytes() for b in batch.buffers()] == cut and ds.jpegs == whole
    assert 0 < sum(c != w for c, w in zip(cut, whole)) and all(len(c) == len(w) for c, w in zip(cut, whole))


PARTIAL_TRANSFORMS = {
    "crop": [A.RandomResizedCrop(64), A.RandomHorizontalFlip()],
    "crop-vflip": [A.RandomResizedCrop((48, 80), scale=(0.05, 0.5)), A.RandomVerticalFlip()],
    "affine": [A.RandomAffine(30, translate=(0.2, 0.2), scale=(0.5, 1.2), shear=10), A.Resize((96, 128))],
    "centre": [A.Resize(120), A.CenterCrop(100)],
}


@pytest.mark.parametrize("name", sorted(PARTIAL_TRANSFORMS))
def test_partial_decode_warps_to_the_whole_images_pixels(name):
    """Each JPEG cut short to the rows its warp reads (the loader's partial_decode), decoded by
    libjpeg-turbo and warped by cv2 with every interpolation and border, gives the warp of the whole
    image, while real photographs are cut (by up to 75% of their rows)."""
    import cv2
    from orbbec.data._samples import prepare

    class Photos(torch.utils.data.Dataset):
        jpegs = [encode(photo(i, (180 + 36 * (i % 3), 240)), quality=90) for i in range(12)]

        def __len__(self):
            return len(self.jpegs)

        def __getitem__(self, i):
            return self.jpegs[i]

    ds = Photos()
    batch = prepare(ds, list(range(len(ds))), transform=A.Compose(PARTIAL_TRANSFORMS[name]), seed=3, epoch=1,
                    box_min_visible=0.0, flip_pairs=None, ragged="padded", partial_decode=True)
    cut = 0
    h, w = batch.params.size
    for k, (whole, part) in enumerate(zip(ds.jpegs, batch.buffers())):
        full = cv2.imdecode(np.frombuffer(whole, np.uint8), cv2.IMREAD_COLOR)
        top = cv2.imdecode(np.frombuffer(part, np.uint8), cv2.IMREAD_COLOR)
        cut += top.shape[0] < full.shape[0]
        M = batch.params.matrices[k].numpy()
        for interp in (cv2.INTER_LINEAR, cv2.INTER_CUBIC, cv2.INTER_LANCZOS4):
            for border in (cv2.BORDER_CONSTANT, cv2.BORDER_REPLICATE, cv2.BORDER_REFLECT_101):
                want = cv2.warpAffine(full, M, (w, h), flags=interp, borderMode=border, borderValue=(7, 8, 9))
                got = cv2.warpAffine(top, M, (w, h), flags=interp, borderMode=border, borderValue=(7, 8, 9))
                assert np.array_equal(got, want), (name, k, top.shape, interp, border)
    if name != "affine":  # the affine's rotations reach the bottom rows of most images
        assert cut >= len(ds) // 3, cut


class _Done:
    """Stands in for a CUDA event whose work has finished."""

    def query(self):
        return True


def test_worker_batches_arrive_intact_through_reused_slots():
    """With workers, the bytes travel in shared-memory slots that are reused once released, and the
    small tensors by value: every batch, many more than there are slots, arrives intact (bytes,
    boxes, labels, matrices), and released slots are taken again rather than new ones made."""
    from orbbec.data import _loader
    from orbbec.data._samples import prepare
    from orbbec.data._shared import SlotTable

    ds = JpegDataset(24)
    slots = SlotTable(2, 3)
    cfg = _loader._Config(ds, _transform(), torch.device("cuda"), "RGB", "raise", "padded", 0.0, None, 0, slots)
    keys = _loader.Keys()
    batches = [[(3 * k + j) % 24 for j in range(5 + k % 3)] for k in range(16)]  # sizes vary
    keys.source = [(0, 7, b) for b in batches]
    reader = torch.utils.data.DataLoader(_loader._Batches(cfg), batch_size=None, sampler=keys, num_workers=2,
                                         collate_fn=_loader._identity, prefetch_factor=1)
    received, fresh = 0, 0
    for indices, batch in zip(batches, _loader.start_workers(reader)):
        fresh += batch.packed is not None
        batch.unpack(slots)
        want = prepare(ds, indices, transform=_transform(), seed=7, epoch=0, box_min_visible=0.0, flip_pairs=None,
                       ragged="padded", partial_decode=True)  # the headers cut short travel too
        assert batch.indices == indices and batch.slot is not None
        assert [e.tobytes() for e in batch.buffers()] == [bytes(e) for e in want.buffers()]
        assert torch.equal(batch.params.matrices, want.params.matrices)
        for k in ("boxes", "labels", "num_boxes"):
            assert isinstance(batch.targets[k], torch.Tensor) and torch.equal(batch.targets[k], want.targets[k]), k
        slots.release_after(*batch.slot, _Done())
        received += 1
    assert received == len(batches)
    assert fresh < len(batches) // 2, "released slots were not reused"
    assert (slots.flags == 0).all()


def test_slots_of_batches_never_started_are_free_to_the_next_generation():
    """A pass of the loader's threads that ends early leaves batches it received but never started,
    and the DataLoader drops the batches its workers had ready when it resets: none of them is ever
    released. Their slots go back to the workers for the next generation's keys (and their tensors
    travel again, as the main process may never have seen them), so the next pass's batches all
    come in slots, intact, and none of the slots still read by the GPU is taken."""
    from orbbec.data import _loader
    from orbbec.data._samples import prepare
    from orbbec.data._shared import FREE, SlotTable

    ds = JpegDataset(24)
    slots = SlotTable(2, 3)
    cfg = _loader._Config(ds, _transform(), torch.device("cuda"), "RGB", "raise", "padded", 0.0, None, 0, slots)
    keys = _loader.Keys()
    reader = torch.utils.data.DataLoader(_loader._Batches(cfg), batch_size=None, sampler=keys, num_workers=2,
                                         collate_fn=_loader._identity, prefetch_factor=1, persistent_workers=True)
    keys.source = [(0, 7, [(5 * k + j) % 24 for j in range(4 + k % 3)]) for k in range(12)]
    first = []
    for batch in _loader.start_workers(reader):  # the first pass: two batches started, two not
        batch.unpack(slots)
        first.append(batch)
        if len(first) == 4:
            break
    slots.release_after(*first[0].slot, _Done())
    still_read = first[1].slot  # its GPU work has not run yet
    slots.pending.append((still_read, _NotDone()))

    keys.generation += 1
    slots.begin_generation(keys.generation)
    batches = [[(3 * k + j) % 24 for j in range(5 + k % 3)] for k in range(16)]
    keys.source = [(1, 7, b) for b in batches]
    received = 0
    for indices, batch in zip(batches, _loader.start_workers(reader)):
        assert batch.slot is not None, f"batch {received} of the second pass found no free slot"
        assert batch.slot != still_read, "a slot the GPU still reads was taken"
        batch.unpack(slots)
        want = prepare(ds, indices, transform=_transform(), seed=7, epoch=1, box_min_visible=0.0, flip_pairs=None,
                       ragged="padded", partial_decode=True)
        assert batch.indices == indices
        assert [e.tobytes() for e in batch.buffers()] == [bytes(e) for e in want.buffers()], received
        slots.release_after(*batch.slot, _Done())
        received += 1
    assert received == len(batches)
    assert slots.flags[still_read].item() != FREE


class _NotDone:
    """Stands in for a CUDA event whose work is still queued."""

    def query(self):
        return False


@pytest.mark.skipif(not HAS_CUDA, reason="page-locking the slots needs CUDA")
def test_slots_are_page_locked_in_place_and_unlocked_when_replaced_or_dropped():
    """The GPU path's slots are page-locked once when they arrive (so the decoder's bitstream copies
    are DMAs); a slot grown by its worker is unlocked before its successor is locked, and a table
    that goes unlocks all of its slots once their last GPU work has finished."""
    import gc

    from orbbec.data._shared import SlotTable

    # torch's is_pinned() reads False in a process where torch has no CUDA context yet, whatever the
    # driver registered (seen on the H100 when this test ran first); the loader's side stream makes
    # the context before any slot arrives.
    torch.zeros(1, device="cuda")
    slots = SlotTable(1, 2, pin=True)
    a = torch.empty(1 << 16, dtype=torch.uint8).share_memory_()
    assert not a.is_pinned()
    assert slots.attach(0, 0, a) is a and a.is_pinned()
    assert slots.attach(0, 0, None) is a  # a later batch in the same slot: nothing new to lock
    b = torch.empty(1 << 17, dtype=torch.uint8).share_memory_()  # the slot grown
    slots.attach(0, 0, b)
    assert b.is_pinned() and not a.is_pinned()
    c = torch.empty(1 << 16, dtype=torch.uint8).share_memory_()
    slots.attach(0, 1, c)
    event = torch.cuda.Event()
    event.record()
    slots.release_after(0, 0, event)
    del slots
    gc.collect()
    assert not b.is_pinned() and not c.is_pinned()
