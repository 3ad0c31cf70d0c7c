"""orbbec.data.GPULoader: batches that depend on (seed, epoch, index) only (0/2/4 workers, world size
1 and 2), resume mid-epoch, late workers, corrupt files and bad items, DataLoader's arguments; on the
CPU path (CI) and the GPU path. Targets: test_data_targets.py; the workers' shared slots and
partial decoding: test_data_slots.py."""
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
from loader_data import JpegDataset, by_index, make_transform

import orbbec.augment as A
from orbbec.data import GPULoader
from orbbec.io import JpegDecodeError


@pytest.mark.parametrize("device", DEVICES)
def test_same_seed_same_batches_whatever_the_workers(device):
    ds = JpegDataset()
    runs = [by_index(GPULoader(ds, 5, transform=make_transform(), shuffle=True, num_workers=w, seed=7, device=device))
            for w in (0, 2, 4)]
    assert sorted(runs[0]) == list(range(len(ds)))
    for other in runs[1:]:
        for i in runs[0]:
            assert torch.equal(runs[0][i][0], other[i][0]) and torch.equal(runs[0][i][1], other[i][1])
    # another seed or another epoch: other parameters
    other_seed = by_index(GPULoader(ds, 5, transform=make_transform(), seed=8, device=device))
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
    ld = GPULoader(ds, 4, transform=make_transform(False), shuffle=True, seed=3, device=device)
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
    make = lambda seed: GPULoader(ds, 4, transform=make_transform(), shuffle=True, seed=seed, device=device, num_workers=2)

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
    tf = make_transform(colour)
    for b in GPULoader(ds, 5, transform=tf, shuffle=True, seed=4, device="cuda", return_params=True):
        labels = b["label"].tolist()
        want = tf.apply(decode_jpeg([ds.jpegs[i] for i in labels], device="cuda"), b["params"])
        assert torch.equal(b["image"], want)
    assert sum(used) >= 2  # (and the next epoch's, read ahead)
    assert sum(cut) >= len(cut) // 4, (sum(cut), len(cut))


@pytest.mark.parametrize("device", DEVICES)
def test_resume_mid_epoch_gives_the_rest_of_the_epoch(device):
    ds = JpegDataset(20)
    make = lambda: GPULoader(ds, 3, transform=make_transform(), shuffle=True, seed=5, device=device, num_workers=2)
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
    make = lambda ds, w: GPULoader(ds, 3, transform=make_transform(), shuffle=True, num_workers=w, seed=4, device=device)
    want = _labels_and_images(make(JpegDataset(), 0), (0, 1))
    got = _labels_and_images(make(_SlowAt(slow=[2, 11]), 4), (0, 1))
    assert [labels for labels, _ in got] == [labels for labels, _ in want]
    for (labels, a), (_, b) in zip(got, want):
        assert torch.equal(a, b), labels


@pytest.mark.parametrize("device", DEVICES)
def test_an_error_comes_after_every_batch_before_it(device):
    """A sample that raises in the dataset, with an earlier batch late: every batch before the
    failing one is handed out first, then its error."""
    make = lambda ds, w: GPULoader(ds, 3, transform=make_transform(), shuffle=True, num_workers=w, seed=4, device=device)
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
    good = by_index(GPULoader(JpegDataset(), 6, transform=make_transform(), seed=2, device=device))
    with pytest.raises(JpegDecodeError, match="sample 9"):
        list(GPULoader(JpegDataset(bad=[9]), 6, transform=make_transform(), seed=2, device=device, num_workers=workers))
    ld = GPULoader(JpegDataset(bad=[9, 13]), 6, transform=make_transform(), seed=2, device=device, on_error="skip",
                   num_workers=workers)
    kept = by_index(ld)
    assert sorted(ld.skipped) == [9, 13] and sorted(kept) == sorted(set(good) - {9, 13})
    for i in kept:  # the other samples of those batches are untouched
        assert torch.equal(kept[i][0], good[i][0]) and torch.equal(kept[i][1], good[i][1])


_RANK_SCRIPT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    sys.path[:0] = {paths!r}
    import loader_data as D
    from orbbec.data import GPULoader
    dist.init_process_group("gloo")
    ld = GPULoader(D.JpegDataset(), 4, transform=D.make_transform(), shuffle=True, seed=9, device="cpu", num_workers=1)
    seen = D.by_index(ld)
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
    single = by_index(GPULoader(ds, 4, transform=make_transform(), shuffle=True, seed=9, device="cpu",
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
        from loader_data import JpegDataset, make_transform
        from orbbec.data import GPULoader
        loader = GPULoader(JpegDataset(12), 4, transform=make_transform(), shuffle=True, num_workers=2,
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
    make = lambda ds, **kw: GPULoader(ds, 6, transform=make_transform(), seed=2, device=device, **kw)
    good = by_index(make(JpegDataset()))
    for name, image in BAD_IMAGES.items():
        ds = JpegDataset()
        bad = [ds[i] for i in range(len(ds))]
        huge = isinstance(image, str)
        bad[5]["image"] = with_frame_size(bad[5]["image"], 65500, 65500) if huge else image
        with pytest.raises(JpegDecodeError, match="sample 5 "):
            list(make(bad))
        ld = make(bad, on_error="skip")
        kept = by_index(ld)
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
        list(GPULoader(Missing(), 4, transform=make_transform(), device="cpu", num_workers=workers))
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
    ld = GPULoader(_TaggedByWorker(12), 3, transform=make_transform(), device=device, num_workers=2,
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


