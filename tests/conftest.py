"""Shared test fixtures: devices to run on and the sample photographs of docs/workloads.md."""
import glob
import os
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The tests use the checkout's orbbec where it is built (an editable install or an in-place build),
# else the installed one (`pip install .`): `python -m pytest` puts the checkout first on sys.path,
# where an unbuilt orbbec/ would hide the installed package. Subprocesses get the same choice.
CHECKOUT_BUILT = bool(glob.glob(os.path.join(ROOT, "orbbec", "_C.*")))
if not CHECKOUT_BUILT:
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != ROOT]
CHECKOUT_PATH = [ROOT] if CHECKOUT_BUILT else []  # what subprocesses put before their own path

# Before the CUDA check below starts the driver, as a training script should (orbbec widens CUDA's
# work queues when imported: orbbec/common/cuda_connections.py).
import orbbec  # noqa: E402,F401


def subprocess_env(**extra):
    """os.environ with PYTHONPATH leading to the orbbec these tests use, plus extra variables."""
    path = os.pathsep.join(filter(None, CHECKOUT_PATH + [os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **extra)


HAS_CUDA = torch.cuda.is_available()
CUDA_SKIP_REASON = "CUDA test: no CUDA device on this machine"

# Parametrize a test over devices with `@pytest.mark.parametrize("device", DEVICES)`: the CUDA case
# is kept in the list and skipped with a visible reason where there is no GPU.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason=CUDA_SKIP_REASON))]
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason=CUDA_SKIP_REASON)


def torchvision_or_skip():
    """torchvision, or a visible skip saying why: not installed, or installed but not loadable
    with this torch (PyPI's CUDA torchvision beside a +cpu torch fails at import with RuntimeError,
    which pytest.importorskip does not catch)."""
    try:
        import torchvision.ops
    except Exception as exc:  # noqa: BLE001  (any failure to load means: no comparison here)
        pytest.skip(f"torchvision comparison: torchvision not usable with torch {torch.__version__} ({exc})")
    return torchvision.ops


def sample_photos(size=None):
    """scikit-image's astronaut, chelsea, coffee, rocket as BGR uint8 HWC arrays (docs/workloads.md),
    image i rolled horizontally by 37*i pixels; resized to size=(h, w) with cv2.INTER_LINEAR if given."""
    import cv2
    from skimage import data

    photos = []
    for i, name in enumerate(["astronaut", "chelsea", "coffee", "rocket"]):
        img = getattr(data, name)()
        if size is not None:
            img = cv2.resize(img, (size[1], size[0]), interpolation=cv2.INTER_LINEAR)
        img = np.roll(img, 37 * i, axis=1)
        photos.append(np.ascontiguousarray(img[:, :, ::-1]))
    return photos


@pytest.fixture(scope="session")
def photos():
    return sample_photos()
