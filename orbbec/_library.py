"""Loads the native extension orbbec._C once and explains what to do when it cannot be loaded."""
from __future__ import annotations

import importlib

import torch

_REBUILD_HINT = (
    "Rebuild it against the torch you have: `pip install --no-build-isolation -e .` in the orbbec "
    "checkout (see README.md)."
)


def _load():
    try:
        return importlib.import_module("orbbec._C")
    except ImportError as exc:  # not built, or built against another torch
        raise ImportError(
            f"orbbec's native extension orbbec._C could not be loaded ({exc}). "
            f"This torch is {torch.__version__}. {_REBUILD_HINT}"
        ) from exc


_C = _load()

if _C.torch_version != torch.__version__.split("+")[0]:
    raise ImportError(
        f"orbbec._C was built against torch {_C.torch_version} but torch {torch.__version__} is "
        f"imported. {_REBUILD_HINT}"
    )


def get_compiler_version() -> str:
    """The C++ compiler that built orbbec._C, e.g. 'gcc 12.2.0'."""
    return _C.get_compiler_version()


def get_compiling_cuda_version() -> str:
    """The CUDA runtime version orbbec._C was compiled with, or 'not available'."""
    return _C.get_compiling_cuda_version()


def with_cuda() -> bool:
    """True when orbbec._C holds CUDA kernels (built with WITH_CUDA)."""
    return bool(_C.with_cuda())


