"""Which samples a rank reads in an epoch, in which batches: torch's DistributedSampler order (the
same permutation, padding and striding), so that orbbec's built-in sharding and a DistributedSampler
handed to the loader give identical batches."""
from __future__ import annotations

import math
from typing import List, Optional

import torch


def world() -> tuple:
    """(rank, world_size) of the default process group, or (0, 1) outside torch.distributed."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def epoch_indices(n: int, *, shuffle: bool, seed: int, epoch: int, rank: int, world_size: int,
                  drop_last: bool) -> List[int]:
    """The dataset indices of this rank for the epoch (DistributedSampler's rule: the tail is padded
    by repeating the start, or dropped when drop_last, so that every rank gets as many)."""
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        indices = torch.randperm(n, generator=g).tolist()
    else:
        indices = list(range(n))
    if drop_last and n % world_size:
        per_rank = math.ceil((n - world_size) / world_size)
    else:
        per_rank = math.ceil(n / world_size)
    total = per_rank * world_size
    if not drop_last and total > len(indices) and indices:
        pad = total - len(indices)
        indices += (indices * math.ceil(pad / len(indices)))[:pad]
    else:
        indices = indices[:total]
    return indices[rank:total:world_size]


def sampler_indices(sampler, epoch: int) -> List[int]:
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    return [int(i) for i in sampler]


def batches_of(indices: List[int], batch_size: int, drop_last: bool, skip: int = 0) -> List[List[int]]:
    """Consecutive batches; the last, partial one unless drop_last; the first `skip` left out (resume)."""
    end = len(indices) - (len(indices) % batch_size if drop_last else 0)
    out = [indices[i:i + batch_size] for i in range(0, end, batch_size)]
    return out[skip:]


def batch_count(indices_len: int, batch_size: int, drop_last: bool) -> int:
    return indices_len // batch_size if drop_last else math.ceil(indices_len / batch_size)


def optional_world(rank: Optional[int], world_size: Optional[int]) -> tuple:
    if rank is None and world_size is None:
        return world()
    if rank is None or world_size is None:
        raise ValueError("GPULoader: give both rank and world_size, or neither (then torch.distributed's)")
    if not 0 <= rank < world_size:
        raise ValueError(f"GPULoader: rank must lie in [0, world_size={world_size}), got {rank}")
    return int(rank), int(world_size)
