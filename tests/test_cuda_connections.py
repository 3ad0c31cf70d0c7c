"""orbbec widens CUDA's work queues (CUDA_DEVICE_MAX_CONNECTIONS) when imported before CUDA starts.

What the wider queues change is measured, not tested (docs/data.md): no CUDA call reports the
queues a process got, and a test with two streams could not tell one queue from 32 (a kernel on
one stream ran beside a sleeping kernel on the other with the variable at 1 too)."""
import subprocess
import sys

import pytest
import torch

from conftest import requires_cuda, subprocess_env
from orbbec.common import cuda_connections

VAR = cuda_connections.VARIABLE


@pytest.fixture(autouse=True)
def _restore_state(monkeypatch):
    monkeypatch.setattr(cuda_connections, "state", cuda_connections.state)


def test_sets_the_variable_when_cuda_has_not_started():
    env = {}
    assert cuda_connections.widen(env, cuda_initialized=False) == "set"
    assert env[VAR] == "32"
    assert cuda_connections.advice() is None


def test_keeps_the_users_value():
    env = {VAR: "1"}
    assert cuda_connections.widen(env, cuda_initialized=False) == "user"
    assert env[VAR] == "1"
    assert cuda_connections.advice() is None


def test_too_late_once_cuda_runs_and_says_what_to_do():
    env = {}
    assert cuda_connections.widen(env, cuda_initialized=True) == "too late"
    assert VAR not in env
    assert VAR in cuda_connections.advice() and "import orbbec before" in cuda_connections.advice()
    with pytest.warns(RuntimeWarning, match=VAR):
        cuda_connections.warn_if_cuda_started_first()


def test_no_warning_when_orbbec_came_first(recwarn):
    cuda_connections.widen({}, cuda_initialized=False)
    cuda_connections.warn_if_cuda_started_first()
    assert not [w for w in recwarn if VAR in str(w.message)]


def test_importing_orbbec_sets_it_in_a_fresh_process():
    env = {k: v for k, v in subprocess_env().items() if k != VAR}
    out = subprocess.run([sys.executable, "-c", "import os, orbbec; from orbbec.common import cuda_connections as c; "
                          f"print(c.state, os.environ['{VAR}'])"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["set", "32"]


def test_without_a_driver_nothing_has_started():
    """On a machine without the CUDA driver (CI) the check answers False instead of failing."""
    assert cuda_connections.driver_started() in (True, False)
    if not torch.cuda.is_available():
        assert cuda_connections.driver_started() is False


@requires_cuda
@pytest.mark.parametrize("first, expected", [("import orbbec", ["set", "32"]),
                                             ("torch.cuda.is_available(); import orbbec", ["too late", "unset"])])
def test_a_started_driver_is_found_without_starting_it(first, expected):
    """torch.cuda.is_available() starts the driver (cuInit), after which the variable no longer
    counts: orbbec says so instead of setting it; before, importing orbbec sets it."""
    env = {k: v for k, v in subprocess_env().items() if k != VAR}
    code = (f"import os, torch; {first}; from orbbec.common import cuda_connections as c; "
            f"print(c.state.replace(' ', '_'), os.environ.get('{VAR}', 'unset'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [expected[0].replace(" ", "_"), expected[1]]
