"""Rules shared by every orbbec op family: the exception classes of argument errors (docs/errors.md).

An orbbec argument error names the argument and says what was expected. Its class derives from
ValueError (TypeError where the type is wrong), as the Python checks always raised, and from
RuntimeError, which is what torchvision.ops (and most of torch) raise for the same mistakes: code
written against torchvision that catches RuntimeError keeps working with orbbec as a drop-in.
"""
from __future__ import annotations

import torch

__all__ = ["ArgumentError", "ArgumentTypeError", "check_not_quantized", "call_op"]


class ArgumentError(ValueError, RuntimeError):
    """A bad argument value or shape: catchable as ValueError or RuntimeError."""


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong type or dtype: catchable as TypeError, ValueError or RuntimeError."""


def check_not_quantized(t, name: str, where: str) -> None:
    """Quantized tensors are not supported by any orbbec op (torchvision's quantized roi_align and
    nms have no counterpart here): say so instead of reporting an odd dtype."""
    if isinstance(t, torch.Tensor) and t.is_quantized:
        raise ArgumentTypeError(f"{where}: '{name}' is a quantized tensor ({t.dtype}); orbbec does not support "
                                f"quantized tensors: pass t.dequantize()")


def call_op(op, *args):
    """Calls a torch.ops.orbbec op, raising the C++ argument checks' ValueError / TypeError (their
    messages start with "orbbec") as ArgumentError / ArgumentTypeError, like the Python checks."""
    try:
        return op(*args)
    except (ValueError, TypeError) as exc:
        if isinstance(exc, ArgumentError) or not str(exc).startswith("orbbec"):
            raise
        cls = ArgumentTypeError if isinstance(exc, TypeError) else ArgumentError
        raise cls(str(exc)) from None
