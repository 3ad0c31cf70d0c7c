"""The output-layout rule every op follows (the C++ side: orbbec/common/src/layout.h)."""
from __future__ import annotations

import torch


def output_format(t: torch.Tensor) -> torch.memory_format:
    """channels_last when ``t`` ([N, C, H, W]) is laid out channels_last and not also contiguous,
    else contiguous: an op's output, and the gradient of its input, keep channels_last."""
    if t.shape[1] > 1 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format


def is_channels_last(t: torch.Tensor) -> bool:
    """Whether ``output_format(t)`` is channels_last."""
    return output_format(t) == torch.channels_last
