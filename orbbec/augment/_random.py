"""Reproducible randomness: each sample's parameters come from (seed, epoch, sample index) alone, so a
batch is the same whatever the number of workers, processes or GPUs, and an epoch can resume mid-way.

Each sample's generator is numpy's Philox (a counter-based generator: distinct keys give independent
streams) keyed by (index, a 64-bit mix of seed and epoch), counter at zero. Keying an existing Philox
costs about 3 us where a SeedSequence-seeded generator cost 16-30 us: with a few draws per sample that
was the largest part of a DataLoader worker's batch (face, 256 samples: about 7 ms of 21)."""
from __future__ import annotations

import numpy as np

_MASK = 0xFFFFFFFFFFFFFFFF


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _run_key(seed: int, epoch: int) -> int:
    """One 64-bit word for (seed, epoch): the second half of every sample's key in that epoch."""
    return _splitmix64(_splitmix64(int(seed) & _MASK) ^ (int(epoch) & _MASK))


def index_word(index: int) -> int:
    """A sample's index as the first 64-bit word of its key."""
    return int(index) & _MASK


def _key(run_key: int, index: int) -> np.ndarray:
    return np.array([index_word(index), run_key], dtype=np.uint64)


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of one sample's augmentation parameters (a fresh one on each call)."""
    return np.random.Generator(np.random.Philox(key=_key(_run_key(seed, epoch), index)))


class SampleRngs:
    """sample_rng's streams for the samples of one batch, through one Philox re-keyed per sample: the
    generator returned by `for_index` is valid until the next call (one thread, one sample at a time)."""

    def __init__(self, seed: int, epoch: int):
        self.run_key = _run_key(seed, epoch)
        self.bits = np.random.Philox(0)
        self.generator = np.random.Generator(self.bits)
        self._zeros = np.zeros(4, dtype=np.uint64)  # the state setter copies the values it is given

    def for_index(self, index: int) -> np.random.Generator:
        self.bits.state = {"bit_generator": "Philox",
                           "state": {"counter": self._zeros, "key": _key(self.run_key, index)},
                           "buffer": self._zeros, "buffer_pos": 4, "has_uint32": 0, "uinteger": 0}
        return self.generator


def uniform(rng: np.random.Generator, low: float, high: float) -> float:
    """rng.uniform(low, high) for two scalars: the same draw from the same stream (numpy computes
    low + (high - low) * next_double, and rng.random() is next_double), at about a third of the
    cost of the call (0.7 against 2.2 us), of which a loader worker makes a few per sample. (Where
    numpy's C fuses that multiply-add, e.g. on aarch64, the last bit may differ from its uniform.)"""
    return uniform_of_unit(low, high, rng.random())


def uniform_of_unit(low, high, u):
    """numpy's uniform(low, high) from its next_double `u` in [0, 1) (a float, or an array of them for
    a batch: orbbec/augment/_batched.py), so that both give the same bits."""
    return low + (high - low) * u
