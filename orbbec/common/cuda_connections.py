"""How many hardware work queues CUDA gives this process's streams (CUDA_DEVICE_MAX_CONNECTIONS).

The driver puts every stream's work into one of N queues per device: 8 unless this variable says
otherwise, 32 at most. Streams that share a queue can wait for one another's work (NVIDIA's CUDA
guide calls these false dependencies). orbbec's decoder runs a stream per host thread beside the
loader's and the training step's, so with 8 queues they share. Measured on an H200 with 32 queues
against 8 (docs/data.md, 'Beside a training step'): the 500x375 classification loader 44.9-46.5k
against 36.8-39.6k images/s, and a ResNet-50 step fed by the loader at 91-95% of its speed on
synthetic data against 87-89%.

The driver reads the variable when it starts (cuInit, which torch.cuda.is_available() already
calls: with it first, the same loader ran at 39.8-40.6k), so orbbec sets it when imported, if the
driver has not started yet and the user has not set it (their value is kept).
"""
from __future__ import annotations

import ctypes
import os
import warnings

import torch

VARIABLE = "CUDA_DEVICE_MAX_CONNECTIONS"
WANTED = 32
CUDA_ERROR_NOT_INITIALIZED = 3

# What widen() found: "set" (orbbec set it), "user" (the user's value is kept), "too late"
# (the CUDA driver had already started without it: the driver's default of 8 stands).
state = "not checked"


def driver_started() -> bool:
    """Whether this process has started the CUDA driver (cuInit), asked without starting it: before
    cuInit, cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED. False where there is no driver."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    return driver.cuDeviceGetCount(ctypes.byref(count)) != CUDA_ERROR_NOT_INITIALIZED


def widen(environ=None, cuda_initialized=None) -> str:
    """Sets CUDA_DEVICE_MAX_CONNECTIONS to 32 unless the user set it or the driver already started.
    Returns (and records in `state`) which of "set", "user" or "too late" applied."""
    global state
    environ = os.environ if environ is None else environ
    initialized = (torch.cuda.is_initialized() or driver_started()) if cuda_initialized is None else cuda_initialized
    if VARIABLE in environ:
        state = "user"
    elif initialized:
        state = "too late"
    else:
        environ[VARIABLE] = str(WANTED)
        state = "set"
    return state


def advice() -> str | None:
    """One sentence for a user whose process runs with the driver's 8 queues, or None."""
    if state != "too late":
        return None
    return (f"CUDA started before orbbec was imported (torch.cuda.is_available() starts it), so its "
            f"streams share the driver's default 8 work queues, which slows orbbec's decoder: import "
            f"orbbec before any CUDA call, or set {VARIABLE}={WANTED} in the environment")


def warn_if_cuda_started_first() -> None:
    """At a GPU loader's start: a warning when CUDA ran before orbbec was imported (shown once per
    place by Python's default warning filter)."""
    if state == "too late":
        warnings.warn(advice() + ".", RuntimeWarning, stacklevel=3)
