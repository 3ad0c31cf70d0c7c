"""The runnable examples in scripts/ keep working (run on the CPU here, small sizes)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("script,args,expect", [
    ("demo.py", ["--batch", "16"], "images/s"),
    ("train_loop.py", ["--steps", "2", "--batch", "8"], "aligned faces"),
    ("multi_gpu.py", ["--batch", "24"], "sharded result equals"),
])
def test_script_runs(tmp_path, script, args, expect):
    if script == "demo.py":
        args = args + ["--out", str(tmp_path / "demo.png")]
    # the checkout's orbbec, installed (pip -e) or built in place
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", script), *args], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert expect in done.stdout
    if script == "demo.py":
        assert (tmp_path / "demo.png").stat().st_size > 10000
