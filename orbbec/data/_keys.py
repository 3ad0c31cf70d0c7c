"""The keys the loader's workers read: (epoch, seed, dataset indices) per batch, an epoch's list or
a plan that goes on into the following epochs (the GPU path's threads read ahead across epochs)."""
from __future__ import annotations

from typing import List

import torch

from . import _order


class Keys(torch.utils.data.Sampler):
    """The keys the workers read next, set before each pass: an epoch's list, or a Plan that goes
    on into the following epochs. Each key goes out with the pass's `generation` and its position
    in the pass appended: a worker marks the shared slot it packs into with the generation
    (_shared.SlotTable.claim); a batch's error is raised at its position (_reorder.py)."""

    def __init__(self):
        self.source = []
        self.generation = 1

    def __iter__(self):
        return _with_generation(iter(self.source), self.generation)

    def __len__(self):
        return len(self.source)


def _with_generation(keys, generation: int):
    for seq, k in enumerate(keys):
        yield (*k, generation, seq)


def keys_of(epoch: int, seed: int, indices: List[int], batch_size: int, drop_last: bool, skip: int) -> list:
    """The workers' keys of an epoch's batches, from batch `skip` on."""
    return [(epoch, seed, b) for b in _order.batches_of(indices, batch_size, drop_last, skip=skip)]


class Plan:
    """The loader's own order from (epoch, skip) on, epoch after epoch, each epoch's order computed
    when the workers reach it, with the arguments of the moment the plan was made (a later change,
    e.g. of the seed, is caught by the consumer's key check)."""

    def __init__(self, loader, epoch: int, skip: int):
        self.n, self.batch_size, self.drop_last = len(loader.dataset), loader.batch_size, loader.drop_last
        self.shuffle, self.seed, self.rank, self.world_size = loader.shuffle, loader.seed, loader.rank, loader.world_size
        self.epoch, self.skip = epoch, skip

    def indices(self, epoch: int) -> List[int]:
        return _order.epoch_indices(self.n, shuffle=self.shuffle, seed=self.seed, epoch=epoch, rank=self.rank,
                                    world_size=self.world_size, drop_last=self.drop_last)

    def keys(self, epoch: int, skip: int = 0) -> list:
        return keys_of(epoch, self.seed, self.indices(epoch), self.batch_size, self.drop_last, skip)

    def __iter__(self):
        epoch, skip = self.epoch, self.skip
        while True:
            keys = self.keys(epoch, skip)
            if not keys and skip == 0:
                return  # epochs without batches: nothing would ever come
            yield from keys
            epoch, skip = epoch + 1, 0

    def __len__(self):
        return len(self.keys(self.epoch, self.skip))
