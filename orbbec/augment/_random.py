"""Reproducible randomness: each sample's parameters come from (seed, epoch, sample index) alone, so a
batch is the same whatever the number of workers, processes or GPUs, and an epoch can resume mid-way."""
from __future__ import annotations

import numpy as np


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of one sample's augmentation parameters."""
    return np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, int(epoch), int(index)]))
