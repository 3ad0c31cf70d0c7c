"""The benchmark tools' own machinery (tools/), run on the CPU."""
import os
import sys
import time

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))
from benchmark_pipeline import median_run, run_child, workers_for, write_markdown  # noqa: E402

_PRELUDE = ("import faulthandler, os, signal, subprocess, sys, time\n"
            "faulthandler.register(signal.SIGUSR1, all_threads=True)\n")


def _child(body):
    return [sys.executable, "-c", _PRELUDE + body]


def test_benchmark_child_that_ends_is_not_held_by_what_it_left_behind(tmp_path, monkeypatch):
    """A child ends with os._exit while a process it started (as DataLoader workers are) still holds
    its output: the result comes back at once, and the leftover process is killed."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    mark = tmp_path / "leftover.pid"
    out, _, stall = run_child(_child(
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(mark)!r}, 'w').write(str(p.pid))\n"
        "print('RESULT {}', flush=True)\n"
        "os._exit(0)\n"), timeout=30, name="leftover")
    assert stall is None and "RESULT {}" in out
    pid = int(mark.read_text())
    for _ in range(100):  # killed with the child's session; gone once its parent (init) reaps it
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the child's leftover process {pid} is still running")


def test_benchmark_child_that_does_not_end_leaves_evidence(tmp_path, monkeypatch):
    """A child that does not end within the limit is killed; what it printed before is kept, and a
    file holds its threads' states and its Python stacks."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    out, err, stall = run_child(_child(
        "print('RESULT {}', flush=True)\n"
        "def waits_forever():\n"
        "    time.sleep(600)\n"
        "waits_forever()\n"), timeout=3, name="det orbbec")
    assert "RESULT {}" in out
    assert stall == str(tmp_path / "orbbec_pipeline_stall_det_orbbec.txt")
    evidence = open(stall).read()
    assert "STAT" in evidence and "WCHAN" in evidence  # ps's thread table
    assert "waits_forever" in evidence and "waits_forever" in err  # faulthandler's Python stack


def test_benchmark_rounds_report_the_median_run_and_the_range(tmp_path):
    """With --rounds, a pipeline's row is its median run (every figure from that one process), the
    table shows the range, ratios use the medians, and a failed round neither counts nor hides the
    others."""
    runs = [{"rate": r, "cores": c, "gpu_mb": 100.0} for r, c in ((300.0, 3.0), (100.0, 1.0), (200.0, 2.0))]
    row = median_run(runs + [{"error": "timed out"}])
    assert (row["rate"], row["cores"]) == (200.0, 2.0) and row["rates"] == [300.0, 100.0, 200.0, None]
    assert median_run([{"error": "boom"}]) == {"error": "boom"}
    assert median_run(runs[:1]) == runs[0]  # one round: no range
    results = {"env": "GPU", "seconds": 1.0, "warmup_s": 1.0, "rounds": 3, "workloads": {"face": {
        "orbbec": row, "orbbec decode only": median_run([{"rate": r, "cores": 1.0, "gpu_mb": 1.0} for r in (400, 250)]),
        "DALI, hw_decoder_load 1.0": {"rate": 100.0, "cores": 1.0, "gpu_mb": 1.0}}}}
    write_markdown(results, str(tmp_path / "t.md"))
    text = (tmp_path / "t.md").read_text()
    assert "median of 3 alternated rounds" in text
    assert "| face | orbbec | 200 (100-300) | 2.00 | 80% |" in text  # against decoding alone's median, 250


def test_benchmark_workers_per_workload():
    assert workers_for("9", "face") == 9
    assert workers_for("9,face=12", "face") == 12
    assert workers_for("9,face=12", "det") == 9
    assert workers_for("6,face=12,det=4", "det") == 4
