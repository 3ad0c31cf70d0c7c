"""The runnable examples in scripts/ keep working (run on the CPU here, small sizes)."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, subprocess_env


@pytest.mark.parametrize("script,args,expect", [
    ("demo.py", ["--batch", "16"], "images/s"),
    ("train_loop.py", ["--steps", "2", "--batch", "8"], "aligned faces"),
    ("multi_gpu.py", ["--batch", "24"], "sharded result equals"),
])
def test_script_runs(tmp_path, script, args, expect):
    if script == "demo.py":
        args = args + ["--out", str(tmp_path / "demo.png")]
    env = subprocess_env()  # the orbbec the tests use (conftest.py)
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", script), *args], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert expect in done.stdout
    if script == "demo.py":
        assert (tmp_path / "demo.png").stat().st_size > 10000


def test_train_ddp_two_processes_resume(tmp_path):
    """scripts/train_ddp.py under torchrun with two CPU processes (gloo): each rank trains on its own
    shard, saves the loader's state with the model, and a second run resumes both mid-epoch."""
    # PYTHONFAULTHANDLER: a rank that aborts prints its threads' Python stacks into the report.
    env = subprocess_env(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(ROOT, "scripts", "train_ddp.py"), "--arch", "tiny", "--batch-size", "4", "--steps", "2",
           "--warmup", "1", "--workers", "0", "--images", "40", "--checkpoint", str(tmp_path / "ck.pt"),
           "--save-every", "3"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    # The two ranks share one stdout: read each rank's line by pattern, not by line breaks.
    firsts = dict(re.findall(r"rank (\d)/2 .*?first labels (\[[^\]]*\])", first.stdout))
    assert sorted(firsts) == ["0", "1"] and firsts["0"] != firsts["1"], first.stdout
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    # 40 images, 2 ranks, batch 4: 5 batches per rank and epoch; saved after step 3 of the first run
    for rank in (0, 1):
        assert f"rank {rank}: resumed at step 3, loader {{'epoch': 0, 'batches_served': 3, 'seed': 0}}" in second.stdout
