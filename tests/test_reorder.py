"""A batch's error raised at the batch's place in the order (orbbec/data/_reorder.py): the keys'
positions and the consumer's reordering (CPU, runs in CI; the loader's own test is in test_data.py,
test_an_error_comes_after_every_batch_before_it)."""
import random

from orbbec.data._keys import Keys
from orbbec.data._reorder import MISSING, BatchError, InOrder


def test_each_key_carries_its_generation_and_position():
    keys = Keys()
    keys.source = [(0, 1, [i, i + 1]) for i in range(4)]
    keys.generation = 3
    assert list(keys) == [(0, 1, [i, i + 1], 3, i) for i in range(4)]


def test_in_order_gives_the_batches_and_errors_back_in_their_order():
    items = [(type("B", (), {"extra": {"seq": s}})(), None) for s in range(30)]
    items[7] = BatchError(7, ValueError("sample 7"))
    shuffled = items[:]
    random.Random(5).shuffle(shuffled)
    back, got = InOrder(), []
    for item in shuffled:
        back.add(item)
        while (x := back.pop()) is not MISSING:
            got.append(x)
    assert got == items and not back.early
