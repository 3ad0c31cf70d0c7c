"""Each sample's drawn parameters as one numpy column per name, for the draws made for a whole batch
at once (_batched.py), which compute them as columns anyway.

A dict per sample, with tuples inside (RandomAffine's translate and shear, RandomResizedCrop's crop),
cost a loader worker the Python to build it, and the loader's process the time to unpickle it (about
190 objects per detection batch of 64, 260 per classification batch of 128: 45-110 us of the
receiving thread's time, holding the GIL that the decoding thread needs), objects that Python's cyclic
garbage collector then tracks while the batch is in flight. As columns they are a handful. The dicts
are made at the first access, with the types the loop's draw gives (float, int, bool, or a tuple of
them), so a SampleColumns reads, compares and prints as the loop's list does."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Dict, Iterable, Tuple

import numpy as np


class SampleColumns(Sequence):
    """A read-only sequence of per-sample dicts kept as columns: `columns` maps each name, in the
    dicts' order, to ("scalar", [n] array) or ("tuple", [n, k] array). Only the columns travel in a
    pickle; the dicts are made once, when first read."""

    def __init__(self, columns: Dict[str, Tuple[str, np.ndarray]], count: int):
        self.columns, self.length = columns, count
        self._dicts = None

    def column(self, name: str) -> np.ndarray:
        """One name's values for every sample, as an array (KeyError where no sample has it)."""
        return self.columns[name][1]

    def _made(self) -> list:
        if self._dicts is None:
            rows = [[tuple(v) for v in a.tolist()] if kind == "tuple" else a.tolist()
                    for kind, a in self.columns.values()]
            names = list(self.columns)
            self._dicts = ([dict(zip(names, values)) for values in zip(*rows)] if rows
                           else [{} for _ in range(self.length)])
        return self._dicts

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i):
        return self._made()[i]

    def __iter__(self):
        return iter(self._made())

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and not isinstance(other, (str, bytes)) and list(self) == list(other)

    def __getstate__(self):
        return {**self.__dict__, "_dicts": None}

    def __repr__(self) -> str:
        return repr(self._made())


def names_of(samples) -> Iterable[str]:
    """The names any sample has, whichever way the samples are kept (one look at a batch's names)."""
    return samples.columns if isinstance(samples, SampleColumns) else set().union(*samples)


def values_of(samples, name: str, default) -> list:
    """Each sample's value of `name` (`default` where it has none), read from the column where the
    samples are kept as columns: making the dicts would cost a worker what the columns save."""
    if isinstance(samples, SampleColumns):
        return samples.column(name).tolist() if name in samples.columns else [default] * len(samples)
    return [s.get(name, default) for s in samples]


def as_list(samples: Any):
    """A plain list of dicts (for the user), whichever way the samples were kept."""
    return list(samples) if isinstance(samples, SampleColumns) else samples
