"""orbbec.data's workers' hand-over: packed bytes, the shared slots they travel in, and JPEGs cut to the
rows their warp reads (partial_decode)."""

import numpy as np
import pytest
import torch

from conftest import HAS_CUDA
from jpeg_files import cut_short, encode, photo
from loader_data import JpegDataset, make_transform

import orbbec.augment as A


def test_packed_bytes_round_trip():
    """Workers of the GPU path hand the encoded bytes over as one tensor: nothing lost or shifted."""
    from orbbec.data._samples import prepare

    ds = JpegDataset(7, bad=[2])
    ds.jpegs[4] = b"not a jpeg"
    batch = prepare(ds, list(range(7)), transform=make_transform(), seed=0, epoch=0, box_min_visible=0.0,
                    flip_pairs=None, ragged="padded")
    before = [None if e is None else bytes(e) for e in batch.encoded]
    batch.pack()
    after = [None if e is None else e.tobytes() for e in batch.buffers()]
    assert after == before and before[4] is None and before[0] == ds.jpegs[0]
    # Rows cut short: the packed copy carries the cut headers, the dataset's bytes stay whole.
    ds = JpegDataset(8)
    whole = [bytes(j) for j in ds.jpegs]
    batch = prepare(ds, list(range(8)), transform=make_transform(), seed=0, epoch=0, box_min_visible=0.0,
                    flip_pairs=None, ragged="padded", partial_decode=True)
    cut = [bytes(b) for b in batch.buffers()]
    batch.pack()
    assert [b.tobytes() for b in batch.buffers()] == cut and ds.jpegs == whole
    assert 0 < sum(c != w for c, w in zip(cut, whole)) and all(len(c) == len(w) for c, w in zip(cut, whole))


def test_pack_buffers_takes_every_buffer_form_and_refuses_what_does_not_fit():
    """The workers' native copy into a slot: bytes, bytearrays, memoryviews and numpy arrays end to
    end with None taking no room, heights written where cut; a cut outside its buffer, or more bytes
    than the slot holds, raise ValueError naming them and write nothing past the slot."""
    from orbbec._library import _C
    from orbbec.io._buffers import jpeg_frame

    jpeg = encode(photo(3, (96, 64)), quality=90)
    frame = jpeg_frame(jpeg)
    data = [jpeg, None, bytearray(b"abc"), memoryview(b"defg"), np.frombuffer(jpeg, np.uint8)]
    out = torch.full((2 * len(jpeg) + 7 + 5,), 0xAB, dtype=torch.uint8)
    offsets = _C.pack_buffers(data, out, [None, None, None, None, (frame.offset, 32)])
    n = len(jpeg)
    assert offsets == [0, n, n, n + 3, n + 7, 2 * n + 7]
    flat = out.numpy()
    assert flat[:n].tobytes() == jpeg and flat[n:n + 7].tobytes() == b"abcdefg"
    assert flat[n + 7:2 * n + 7].tobytes() == cut_short(jpeg, 32).tobytes() and (flat[2 * n + 7:] == 0xAB).all()
    with pytest.raises(ValueError, match=r"cuts\[1\]"):
        _C.pack_buffers([b"x" * 20, b"y" * 10], out, [None, (4, 16)])
    with pytest.raises(ValueError, match="do not fit"):
        _C.pack_buffers([jpeg, jpeg, jpeg], out)
    with pytest.raises(TypeError, match=r"data\[1\]"):
        _C.pack_buffers([jpeg, 3], out)


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
    cfg = _loader._Config(ds, make_transform(), torch.device("cuda"), "RGB", "raise", "padded", 0.0, None, 0, slots)
    keys = _loader.Keys()
    batches = [[(3 * k + j) % 24 for j in range(5 + k % 3)] for k in range(16)]  # sizes vary
    keys.source = [(0, 7, b) for b in batches]
    reader = torch.utils.data.DataLoader(_loader._Batches(cfg), batch_size=None, sampler=keys, num_workers=2,
                                         collate_fn=_loader._identity, prefetch_factor=1)
    received, fresh = 0, 0
    for indices, batch in zip(batches, _loader.start_workers(reader)):
        fresh += batch.packed is not None
        batch.unpack(slots)
        want = prepare(ds, indices, transform=make_transform(), seed=7, epoch=0, box_min_visible=0.0, flip_pairs=None,
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
    cfg = _loader._Config(ds, make_transform(), torch.device("cuda"), "RGB", "raise", "padded", 0.0, None, 0, slots)
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
        want = prepare(ds, indices, transform=make_transform(), seed=7, epoch=1, box_min_visible=0.0, flip_pairs=None,
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
