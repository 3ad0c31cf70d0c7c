"""A batch's error raised at the batch's place in the order (GPU path).

Each key carries its position in the pass (`seq`). An exception of one batch (the dataset's, in a
worker, or the decoder's or the warp's, in the loader's threads) travels down the loader's threads
as a BatchError at that position, and the threads go on: the batches before it, still in flight
behind it (a batch decodes while the next one starts), reach the consumer first, and then its error
is raised. (When the error ended the threads at once, the batch started before it was lost.)
InOrder puts the items back in order of position before the consumer takes them.
"""
from __future__ import annotations

from typing import Any, Dict

MISSING = object()


class BatchError:
    """The exception of one batch, in its place in the order."""

    def __init__(self, seq: int, error: BaseException):
        self.seq, self.error = seq, error

    def reraise(self):
        raise self.error


def seq_of(item) -> int:
    """The position of a batch, a (batch, event) pair or a BatchError."""
    if isinstance(item, BatchError):
        return item.seq
    batch = item[0] if isinstance(item, tuple) else item
    return batch.extra["seq"]


class InOrder:
    """The consumer's side: items put back in order of position."""

    def __init__(self):
        self.next = 0
        self.early: Dict[int, Any] = {}

    def add(self, item) -> None:
        self.early[seq_of(item)] = item

    def pop(self):
        """The next item in order, or MISSING if it has not come yet."""
        item = self.early.pop(self.next, MISSING)
        if item is not MISSING:
            self.next += 1
        return item
