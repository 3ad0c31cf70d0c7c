"""orbbec.augment's sample columns: the parameters of draws made for a whole batch at once are kept
as one column per name (augment/_columns.py); they read, compare, print and pickle as the loop's list
of dicts does (values and their types), travel in a handful of objects, and reach the user as a list."""
import gc
import pickle

import numpy as np
import pytest

from loader_data import JpegDataset

import orbbec.augment as A
from orbbec.augment._columns import SampleColumns, as_list

CHAINS = {
    "detection": [A.RandomAffine(10, (0.1, 0.1), (0.75, 1.25), shear=5), A.RandomHorizontalFlip()],
    "classification": [A.RandomResizedCrop(224), A.RandomHorizontalFlip(), A.RandomVerticalFlip(0.3)],
}


def draw(chain, count, loop=False):
    rng = np.random.default_rng(count)
    if chain == "detection":  # (RandomAffine keeps the image's size: one size for the batch)
        sizes = [(640, 640)] * count
    else:
        sizes = [(int(h), int(w)) for h, w in rng.integers(240, 900, (count, 2))]
    indices = rng.permutation(10_000)[:count].tolist()
    aug = A.Compose(CHAINS[chain])
    with pytest.MonkeyPatch.context() as m:
        if loop:
            m.setattr(A, "BATCH_DRAW_MIN", 10**9)
        return aug.draw(sizes, indices, epoch=3, seed=17).samples


def typed(samples):
    """Each value with its type, and each tuple item's type."""
    return [[(k, v, type(v), tuple(map(type, v)) if isinstance(v, tuple) else None) for k, v in s.items()]
            for s in samples]


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_columns_read_pickle_and_print_as_the_loops_list(chain):
    cols, loop = draw(chain, 40), draw(chain, 40, loop=True)
    assert isinstance(cols, SampleColumns) and type(loop) is list
    back = pickle.loads(pickle.dumps(cols, protocol=pickle.HIGHEST_PROTOCOL))
    for got in (cols, back):
        assert typed(got) == typed(loop) and repr(got) == repr(loop)
        assert got == loop and loop == got and len(got) == 40
        assert got[-1] == loop[-1] and got[3:7] == loop[3:7] and list(reversed(got)) == loop[::-1]
        assert got.count(loop[5]) == loop.count(loop[5]) and got.index(loop[5]) == loop.index(loop[5])
        with pytest.raises(IndexError):
            got[40]
    assert type(as_list(back)) is list and as_list(loop) is loop
    flips = back.column("RandomHorizontalFlip.hflip")
    assert flips.tolist() == [s["RandomHorizontalFlip.hflip"] for s in loop]


def tracked_objects_made_by(data: bytes) -> int:
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        kept = pickle.loads(data)  # (held until counted)
        made = len(gc.get_objects()) - before
        del kept
        return made
    finally:
        if enabled:
            gc.enable()


def test_columns_travel_in_a_handful_of_objects():
    """Unpickling 64 samples' columns makes a few objects the collector tracks; the same samples as
    dicts (with tuples inside) make a few per sample."""
    cols = draw("detection", 64)
    as_columns = tracked_objects_made_by(pickle.dumps(cols, protocol=pickle.HIGHEST_PROTOCOL))
    as_dicts = tracked_objects_made_by(pickle.dumps(list(cols), protocol=pickle.HIGHEST_PROTOCOL))
    assert as_columns < 25 and as_dicts > 5 * as_columns, (as_columns, as_dicts)


def test_the_workers_flips_and_the_users_params_come_from_the_columns():
    """A worker's batch keeps the batch draw's columns (its flips read from the column, as from the
    dicts), and a loader with return_params hands the user a plain list of dicts."""
    from orbbec.data import GPULoader
    from orbbec.data._samples import _flips, prepare

    ds = JpegDataset(16)
    tf = A.Compose([A.RandomResizedCrop(48), A.RandomHorizontalFlip()])
    batch = prepare(ds, list(range(16)), transform=tf, seed=0, epoch=0, box_min_visible=0.0, flip_pairs=None,
                    ragged="padded")
    samples = batch.params.samples
    assert isinstance(samples, SampleColumns)
    assert _flips(samples) == _flips(list(samples)) and 0 < sum(_flips(samples)) < 16
    out = next(iter(GPULoader(ds, 8, transform=tf, seed=0, device="cpu", return_params=True)))
    assert type(out["params"].samples) is list and len(out["params"].samples) == 8
    assert all(type(s) is dict for s in out["params"].samples)
