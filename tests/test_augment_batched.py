"""orbbec.augment's draws for a whole batch at once (_batched.py) against the sample-by-sample loop
they stand in for: the same bits, on sizes that make RandomResizedCrop miss, fall back and draw no
position; samples the batch cannot finish drawn again by the loop."""
import numpy as np
import pytest

import orbbec.augment as A
from orbbec.augment import _batched
from orbbec.augment._random import SampleRngs, _key, _run_key
from orbbec.common import ArgumentError


def _loop(aug, sizes, indices, monkeypatch, **kw):
    with monkeypatch.context() as m:
        m.setattr(A, "BATCH_DRAW_MIN", 10**9)
        return aug.draw(sizes, indices, **kw)


def _same(a, b):
    assert a.matrices.dtype == b.matrices.dtype
    assert a.matrices.numpy().tobytes() == b.matrices.numpy().tobytes()  # bits, zeros' signs included
    assert a.size == b.size and a.samples == b.samples
    assert repr(a.samples) == repr(b.samples)  # zeros' signs too (round() gives 0.0 where rint gives -0.0)
    for sa, sb in zip(a.samples, b.samples):
        assert [type(v) for v in sa.values()] == [type(v) for v in sb.values()]


def _batched_compose(chain):
    """Compose of the chain (a function that makes the transforms), which must be drawn batch-wide."""
    aug = A.Compose(chain())
    assert aug._batch_chain is not None
    return aug


def _batch_is_the_loop(aug, sizes, indices, monkeypatch, alone, targets=None, **kw):
    """The batch's draws against the loop's, and samples `alone` drawn by themselves (one alone takes
    the loop): a sample's draws do not depend on its batch. Returns the batch's draws."""
    batch = aug.draw(sizes, indices, targets=targets, **kw)
    _same(batch, _loop(aug, sizes, indices, monkeypatch, targets=targets, **kw))
    for k in alone:
        one = aug.draw([sizes[k]], [indices[k]], targets=None if targets is None else [targets[k]], **kw)
        assert batch.matrices[k].numpy().tobytes() == one.matrices[0].numpy().tobytes()
        assert batch.samples[k] == one.samples[0]
    return batch


def _sizes(rng, n):
    """Photograph-like sizes, and some that RandomResizedCrop cannot fit (slivers, a pixel)."""
    sizes = [(int(rng.integers(1, 1200)), int(rng.integers(1, 1200))) for _ in range(n)]
    sizes[:6] = [(1, 1), (2, 3000), (3000, 2), (375, 500), (500, 375), (7, 9)]
    return sizes


def test_philox_streams_are_numpys_philox():
    from orbbec import _C

    indices = [0, 1, 9, 2**40 + 5, 2**64 - 1]
    for seed, epoch in ((0, 0), (11, 3), (-1, 2)):
        run_key = _run_key(seed, epoch)
        got = _C.philox_streams(np.array(indices, np.uint64), run_key, 24)
        for row, index in zip(got, indices):
            bits = np.random.Philox(key=_key(run_key, index))
            assert row.tolist() == bits.random_raw(24).tolist()


@pytest.mark.parametrize("chain", [
    lambda: [A.RandomResizedCrop(224), A.RandomHorizontalFlip()],
    lambda: [A.RandomResizedCrop((96, 128), scale=(0.5, 1.0), ratio=(0.2, 5.0)), A.RandomHorizontalFlip(),
             A.RandomVerticalFlip(p=0.3)],
    lambda: [A.RandomResizedCrop(64, scale=(0.9, 1.0), ratio=(3.0, 4.0))],  # mostly misses: the central crop
    lambda: [A.RandomResizedCrop(32), A.Normalize(A.IMAGENET_MEAN, A.IMAGENET_STD)],
])
def test_batch_draws_are_the_loops_bits(chain, monkeypatch):
    aug = _batched_compose(chain)
    rng = np.random.default_rng(7)
    for seed, epoch in ((0, 0), (5, 2)):
        sizes = _sizes(rng, 300)
        indices = [int(i) for i in rng.integers(0, 2**50, 300)]
        _batch_is_the_loop(aug, sizes, indices, monkeypatch, range(5), seed=seed, epoch=epoch)


@pytest.mark.parametrize("chain", [
    lambda: [A.RandomAffine(10, (0.1, 0.1), (0.75, 1.25)), A.RandomHorizontalFlip()],  # the det workload's
    lambda: [A.RandomAffine(30, shear=(-10, 10, -5, 5)), A.RandomVerticalFlip(p=0.3)],
    lambda: [A.RandomAffine((-5, 25), (0.3, 0.05), None, 12), A.Normalize(A.IMAGENET_MEAN, A.IMAGENET_STD)],
    lambda: [A.RandomAffine(0)],
])
def test_affine_batch_draws_are_the_loops_bits(chain, monkeypatch):
    """RandomAffine keeps the size, so each batch has one: photographs', and 1 x 1 and slivers, where
    the translations round to zero from below."""
    aug = _batched_compose(chain)
    rng = np.random.default_rng(5)
    for seed, epoch in ((0, 0), (9, 4)):
        for size in ((640, 640), (375, 500), (1, 1), (2, 999)):
            indices = [int(i) for i in rng.integers(0, 2**50, 200)]
            _batch_is_the_loop(aug, [size] * 200, indices, monkeypatch, range(3), seed=seed, epoch=epoch)


def test_affine_matrix_is_torchvisions_chain():
    """affine_entries' closed form against the product it stands for (R SHy SHx S about the centre,
    then the translation), on random parameters: the same matrix to rounding."""
    import math

    from orbbec.augment._geometry import affine_matrix

    rng = np.random.default_rng(3)
    for _ in range(500):
        cx, cy, angle = rng.uniform(0, 2000), rng.uniform(0, 2000), rng.uniform(-180, 180)
        (tx, ty), scale, (shx, shy) = rng.uniform(-100, 100, 2), rng.uniform(0.3, 3), rng.uniform(-40, 40, 2)
        a, sx, sy = math.radians(angle), math.radians(shx), math.radians(shy)
        rot = np.array([[math.cos(a), -math.sin(a), 0], [math.sin(a), math.cos(a), 0], [0, 0, 1]])
        shear_y = np.array([[1, 0, 0], [-math.tan(sy), 1, 0], [0, 0, 1]])
        shear_x = np.array([[1, -math.tan(sx), 0], [0, 1, 0], [0, 0, 1]])
        about = np.array([[1.0, 0, -cx], [0, 1, -cy], [0, 0, 1]])
        back = np.array([[1.0, 0, cx + tx], [0, 1, cy + ty], [0, 0, 1]])
        want = back @ rot @ shear_y @ shear_x @ np.diag([scale, scale, 1.0]) @ about
        got = affine_matrix((cx, cy), angle, (tx, ty), scale, (shx, shy))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)


def _face_targets(rng, sizes):
    """5 landmarks per face, jittered about the ArcFace layout at random scales and places; some
    samples unusable (not finite, all at one point, none given), which AlignFaces resizes whole."""
    base = np.array([[38.3, 51.7], [73.5, 51.5], [56.0, 71.7], [41.5, 92.4], [70.7, 92.2]])
    targets = []
    for h, w in sizes:
        lm = base * rng.uniform(0.5, 2.0) + rng.uniform(0, [w / 2, h / 2]) + rng.normal(0, 2.0, (5, 2))
        targets.append({"landmarks": lm.astype(np.float32)})
    targets[3]["landmarks"][2, 0] = np.nan
    targets[7]["landmarks"][:] = 40.0
    targets[11] = None
    targets[12] = {"label": 4}
    return targets


@pytest.mark.parametrize("chain", [
    lambda: [A.AlignFaces(112), A.RandomHorizontalFlip()],
    lambda: [A.AlignFaces(96), A.RandomVerticalFlip(p=0.3), A.RandomHorizontalFlip(p=0.7)],
    lambda: [A.AlignFaces(112), A.Normalize(A.IMAGENET_MEAN, A.IMAGENET_STD)],
])
def test_face_alignment_batch_draws_are_the_loops_bits(chain, monkeypatch):
    aug = _batched_compose(chain)
    rng = np.random.default_rng(11)
    for seed, epoch in ((0, 0), (3, 5)):
        sizes = [(250, 250)] * 200 + [(int(rng.integers(120, 900)), int(rng.integers(120, 900))) for _ in range(56)]
        indices = [int(i) for i in rng.integers(0, 2**50, len(sizes))]
        targets = _face_targets(rng, sizes)
        batch = _batch_is_the_loop(aug, sizes, indices, monkeypatch, (0, 3, 12), seed=seed, epoch=epoch,
                                   targets=targets)
        valid = [s["AlignFaces.valid"] for s in batch.samples]
        assert valid.count(False) == 4 and not any(valid[k] for k in (3, 7, 11, 12))


def test_flips_alone_keep_each_size_and_refuse_mixed_sizes(monkeypatch):
    aug = A.Compose([A.RandomHorizontalFlip(p=0.6), A.RandomVerticalFlip()])
    assert aug._batch_chain is not None
    sizes, indices = [(120, 160)] * 40, list(range(100, 140))
    _same(aug.draw(sizes, indices, seed=3), _loop(aug, sizes, indices, monkeypatch, seed=3))
    with pytest.raises(ArgumentError, match="sample 105 comes out"):
        aug.draw(sizes[:5] + [(100, 100)] + sizes[6:], indices, seed=3)


def test_chains_drawn_sample_by_sample():
    """Only chains whose products are exact go batch-wide; the others keep the loop."""
    assert A.Compose([A.RandomHorizontalFlip(), A.RandomResizedCrop(64)])._batch_chain is None
    assert A.Compose([A.RandomResizedCrop(64), A.ColorJitter(0.2)])._batch_chain is None
    assert A.Compose([A.RandomRotation(10)])._batch_chain is None
    assert A.Compose([A.RandomResizedCrop(64), A.RandomAffine(10)])._batch_chain is None
    assert A.Compose([A.RandomHorizontalFlip(), A.RandomAffine(10)])._batch_chain is None
    assert A.Compose([A.RandomHorizontalFlip(), A.AlignFaces(112)])._batch_chain is None
    assert A.Compose([A.AlignFaces(112), A.RandomResizedCrop(64)])._batch_chain is None

    class MyCrop(A.RandomResizedCrop):
        pass
    assert A.Compose([MyCrop(64)])._batch_chain is None


def test_samples_the_batch_cannot_finish_are_drawn_by_the_loop(monkeypatch):
    aug = A.Compose([A.RandomResizedCrop(64, scale=(0.9, 1.0), ratio=(3.0, 4.0)), A.RandomHorizontalFlip()])
    sizes, indices = [(400, 300)] * 30 + [(300, 1000)] * 30, list(range(60))
    monkeypatch.setattr(_batched, "WORDS", 4)  # two tries' worth: most samples here need more
    _, _, _, redo = _batched.draw_batch(aug._batch_chain, sizes, indices, _run_key(9, 1))
    assert 0 < len(redo) < 60
    _same(aug.draw(sizes, indices, seed=9, epoch=1), _loop(aug, sizes, indices, monkeypatch, seed=9, epoch=1))


def test_bounded_integers_follow_numpy_or_ask_for_the_loop():
    """Lemire's method on 32-bit halves, as numpy's integers(0, n): equal where not marked for the
    loop; bounds near 2**31 make numpy draw again often, and those rows are marked."""
    n_rows = 400
    indices = list(range(n_rows))
    run_key = _run_key(1, 1)
    bounds = [np.array([1, 2, 3, 500, 2**31 + 12345, 2**32 - 5, 1000] * 58)[:n_rows] for _ in range(3)]
    streams = _batched.Streams(indices, run_key, 24)
    rows = np.arange(n_rows)
    got = [streams.integers(rows, b) for b in bounds] + [streams.doubles(rows)]
    rngs = SampleRngs(1, 1)
    checked = 0
    for r in range(n_rows):
        g = rngs.for_index(indices[r])
        want = [int(g.integers(0, int(b[r]))) for b in bounds] + [g.random()]
        if not streams.redo[r]:
            assert [int(x[r]) for x in got[:3]] + [float(got[3][r])] == want
            checked += 1
    assert 0 < streams.redo.sum() and checked > n_rows // 2
