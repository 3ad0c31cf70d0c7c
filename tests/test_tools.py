"""The benchmark tools' own machinery (tools/), run on the CPU."""
import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "tools", "dev"))  # the engineering probes (worker_times, core_interrupts)
from benchmark_pipeline import (dali_variants, machine_jiffies, machine_share, median_run, run_child,  # noqa: E402
                                workers_for)
from gpu_clocks import parse_rows, summarize  # noqa: E402
from loaded_libraries import mapped_library  # noqa: E402
from pipeline_table import write_markdown  # noqa: E402
from profile_loader import loader_advice  # noqa: E402
from workloads import DecodeAhead, full_batches  # noqa: E402

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


def test_benchmark_measures_dali_under_each_queue_count():
    """DALI runs under both decoder loads and each queue count; the child gets its count in its
    environment (rows under orbbec's 32 keep the usual labels)."""
    assert dali_variants("32,8") == [("DALI, hw_decoder_load 0.65", 0.65, 32), ("DALI, hw_decoder_load 1.0", 1.0, 32),
                                     ("DALI, hw_decoder_load 0.65, 8 queues", 0.65, 8),
                                     ("DALI, hw_decoder_load 1.0, 8 queues", 1.0, 8)]
    out, _, _ = run_child(_child("print('RESULT', os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS'))"), timeout=30,
                          name="env", env=dict(os.environ, CUDA_DEVICE_MAX_CONNECTIONS="8"))
    assert out.split() == ["RESULT", "8"]


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
    assert "| face | orbbec | 200 (100-300) | 2.00 | 80.0% |" in text  # against decoding alone's median, 250
    assert "the other pipelines once" not in text
    assert "the loader against decoding alone" not in text  # two rounds of one, three of the other: no pairs
    results["rounds_of"] = ["orbbec", "orbbec decode only"]  # --rounds-of: DALI measured in the first round only
    write_markdown(results, str(tmp_path / "t.md"))
    assert "(orbbec, orbbec decode only; the other pipelines once, in the first round" in (tmp_path / "t.md").read_text()
    results["workloads"]["face"]["orbbec decode only"] = median_run(
        [{"rate": r, "cores": 1.0, "gpu_mb": 1.0} for r in (400, 250, 1500)] + [{"error": "timed out"}])
    write_markdown(results, str(tmp_path / "t.md"))
    assert "a round's two processes ran one after the other; the machine's share taken by the hypervisor, steal, " \
           "where 2% or more): face 300/400, 100/250, 200/1,500, -/-." in (tmp_path / "t.md").read_text().replace("\n", " ")
    # Each round's steal travels with its rate; a round at 2% or more is marked, one below is not.
    steal_runs = [{"rate": r, "cores": 1.0, "gpu_mb": 1.0, "steal": s}
                  for r, s in ((300, 0.001), (100, 0.059), (200, 0.0))]
    results["workloads"]["face"]["orbbec"] = median_run(steal_runs + [{"error": "timed out"}])
    assert results["workloads"]["face"]["orbbec"]["steals"] == [0.001, 0.059, 0.0, None]
    write_markdown(results, str(tmp_path / "t.md"))
    text = (tmp_path / "t.md").read_text().replace("\n", " ")
    assert "face 300/400, 100/250 (steal 5.9%/-), 200/1,500, -/-." in text
    assert "nvJPEG" not in text  # no row named its library
    results["workloads"]["face"]["orbbec"]["nvjpeg"] = "/usr/local/cuda/lib64/libnvjpeg.so.13"
    results["workloads"]["face"]["orbbec decode only"]["nvjpeg"] = None
    write_markdown(results, str(tmp_path / "t.md"))
    assert ("orbbec's nvJPEG (as loaded, LD_LIBRARY_PATH first): /usr/local/cuda/lib64/libnvjpeg.so.13, not found."
            in (tmp_path / "t.md").read_text())


def test_benchmark_workers_per_workload():
    assert workers_for("9", "face") == 9
    assert workers_for("9,face=12", "face") == 12
    assert workers_for("9,face=12", "det") == 9
    assert workers_for("6,face=12,det=4", "det") == 4


def test_benchmark_reads_the_machines_busy_cores_and_steal():
    """A round's machine-wide figures (to tell a slow host from a slow pipeline): busy cores and steal
    from /proc/stat's ticks between two readings."""
    share = machine_share((1000, 20, 10000), (1400, 70, 11000))
    assert abs(share["machine_cores_busy"] - os.cpu_count() * 0.4) < 1e-9 and abs(share["steal"] - 0.05) < 1e-12
    a = machine_jiffies()
    t = time.perf_counter()
    while time.perf_counter() - t < 0.2:  # keep a core busy
        pass
    b = machine_jiffies()
    assert b[2] > a[2] and b[0] > a[0] and b[1] >= a[1] and b[0] - a[0] <= b[2] - a[2]


def test_gpu_clock_samples_are_read_and_summed_up():
    """nvidia-smi's csv lines (clock, power, limit, temperature, reasons bitmask) become the mean
    clock, the lowest one and the share of samples at the power cap; lines it could not fill
    ([N/A], a cut line) are dropped, and no samples give no summary."""
    rows = parse_rows("1980, 600.5, 700.00, 60, 0x0000000000000000\n"
                      "1500, 699.0, 700.00, 62, 0x0000000000000004\n"
                      "[N/A], 650.0, 700.00, 61, 0x0\n"
                      "1700, 650.0\n"
                      "1740, 690.0, 700.00, 64, 0x0000000000000024\n")
    assert [r[0] for r in rows] == [1980.0, 1500.0, 1740.0]
    text = summarize(rows)
    assert "SM clock 1,740 MHz (min 1,500)" in text
    assert "power cap in 67%" in text and "thermal in 33%" in text and "of 3 samples" in text
    assert summarize([]) is None


def test_profile_loader_advice_follows_the_measured_share():
    """The advice names the training setting only when the default decoder cost the step more than
    5%, and says the loader is behind only when the training setting did."""
    assert loader_advice([6000.0, 6100.0], [5900.0, 5950.0], "default").endswith("synthetic data.")
    slow = loader_advice([6000.0, 6200.0], [5400.0, 5580.0], "default")
    assert "at 90% of" in slow and "--decoder training" in slow
    behind = loader_advice([6000.0], [5000.0], "training")
    assert "at 83% of" in behind and "keep the default decoder" in behind
    assert loader_advice(None, [5000.0], "default") is None


def test_profile_loader_advice_names_the_work_queues_when_cuda_started_first(monkeypatch):
    from orbbec.common import cuda_connections

    monkeypatch.setattr(cuda_connections, "state", "too late")
    slow = loader_advice([6000.0], [5000.0], "default")
    assert "CUDA_DEVICE_MAX_CONNECTIONS=32" in slow and "import orbbec before" in slow
    assert loader_advice([6000.0], [5900.0], "default").endswith("synthetic data.")


def test_full_batches_leave_out_the_last_partial_one():
    assert full_batches(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5]]
    assert full_batches(list(range(6)), 3) == [[0, 1, 2], [3, 4, 5]]
    assert full_batches([1, 2], 3) == []


@pytest.mark.parametrize("in_flight", [1, 2, 3])
def test_decode_ahead_keeps_the_loaders_batches_in_flight_and_takes_each_once(in_flight):
    # The benchmark's ceiling (decoding alone) must start batches as the loader does: with n in
    # flight, the first n - 1 calls take nothing, each later call takes the oldest batch, and drain
    # takes the rest, every image counted once (on the CPU decoder, which the same driver runs).
    from jpeg_files import encode, photo

    batches = [[encode(photo(i + k, (48, 64))) for i in range(k + 1)] for k in range(5)]  # 1..5 images
    ahead = DecodeAhead(device="cpu", in_flight=in_flight)
    taken = [ahead(b) for b in batches]
    assert taken == [0] * (in_flight - 1) + [len(b) for b in batches[:len(batches) - in_flight + 1]]
    assert ahead.drain() == sum(len(b) for b in batches[len(batches) - in_flight + 1:])
    assert ahead.drain() == 0


def test_decode_ahead_follows_the_loaders_depth_by_default(monkeypatch):
    # Decoding alone keeps as many batches in flight as the loader's decoding thread, read from its
    # module when the driver is made (so that a probe's setting reaches both).
    import orbbec.data._stream as loader_stream

    assert DecodeAhead(device="cpu").in_flight == loader_stream.DECODES_IN_FLIGHT
    monkeypatch.setattr(loader_stream, "DECODES_IN_FLIGHT", 3)  # (what loader_stage_probe's --in-flight sets)
    assert DecodeAhead(device="cpu").in_flight == 3


def test_worker_times_are_recorded_per_batch_and_summed_up_per_worker(monkeypatch):
    """Each batch's worker records its own CPU and wall time, context switches and cores
    (tools/dev/worker_times.py, installed before the workers start); the summary groups them by worker."""
    import torch
    from loader_data import JpegDataset, make_transform

    from orbbec.data import _loader
    from worker_times import KEY, _core, install, summary

    assert 0 <= _core() < os.cpu_count()
    monkeypatch.setattr(_loader._Batches, "__getitem__", _loader._Batches.__getitem__)  # unwrapped after the test
    install()
    install()  # twice wraps once
    cfg = _loader._Config(JpegDataset(12), make_transform(), torch.device("cpu"), "RGB", "raise", "padded", 0.0, None, 0)
    keys = _loader.Keys()
    keys.source = [(0, 3, [2 * k, 2 * k + 1]) for k in range(6)]
    reader = torch.utils.data.DataLoader(_loader._Batches(cfg), batch_size=None, sampler=keys, num_workers=2,
                                         collate_fn=_loader._identity)
    records = [batch.extra[KEY] for batch in _loader.start_workers(reader)]
    assert len(records) == 6 and {r[0] for r in records} == {0, 1}
    for worker, cpu, wall, involuntary, voluntary, cores, system, faults in records:
        assert 0 < cpu <= wall * 1.05 and involuntary >= 0 and voluntary >= 0 and len(cores) == 2
        assert 0 <= system <= wall + 0.01 and faults >= 0  # getrusage's split is sampled at the tick
    s = summary(records)
    assert sorted(s) == [0, 1] and sum(v["batches"] for v in s.values()) == 6
    assert all(0 <= v["off_cpu"] <= 1 and v["wall_max_ms"] >= v["wall_ms"] > 0 for v in s.values())
    assert all(0 <= v["core"] < os.cpu_count() and v["system_ms"] <= v["wall_ms"] + 10 for v in s.values())


def test_core_interrupts_reads_proc_and_reports_what_changed_during_a_command():
    from core_interrupts import core_ticks, interrupt_counts, report

    stat = "cpu  9 0 9 9 0 0 0 0 0 0\ncpu0 10 0 5 100 1 0 2 0 0 0\ncpu1 20 0 6 90 0 0 1 0 0 0\nintr 5\n"
    later = "cpu  9 0 9 9 0 0 0 0 0 0\ncpu0 15 0 5 130 1 0 2 0 0 0\ncpu1 60 0 9 91 0 0 4 1 0 0\n"
    irq = ("           CPU0       CPU1\n 42:          0        100   PCI-MSIX-0000:00:06.0 0-edge      nvidia\n"
           "LOC:        500        600   Local timer interrupts\nERR:          0\n")
    irq_later = irq.replace("100   PCI", "900   PCI").replace("500        600", "510        620")
    assert core_ticks(stat) == {"cpu0": [10, 0, 5, 100, 1, 0, 2, 0], "cpu1": [20, 0, 6, 90, 0, 0, 1, 0]}
    counts = interrupt_counts(irq)
    assert counts["42: PCI-MSIX-0000:00:06.0 0-edge nvidia"] == [0, 100] and counts["ERR:"] == [0]
    text = report(core_ticks(stat), core_ticks(later), counts, interrupt_counts(irq_later)).splitlines()
    assert "cpu1 [40, 0, 3, 1, 0, 0, 3, 1]" in text
    lines = text[text.index("busiest interrupt lines: total, line, per core") + 1:]
    assert lines[0] == "800 42: PCI-MSIX-0000:00:06.0 0-edge nvidia [0, 800]" and lines[1].startswith("30 LOC:")
    # and around a real command on this machine, with its exit status
    run = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "dev", "core_interrupts.py"), sys.executable,
                          "-c", "import sys; sys.exit(3)"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 3 and "cpu0 [" in run.stdout and "busiest interrupt lines" in run.stdout


def test_benchmark_tables_merged_from_two_runs_keep_every_workload_and_its_workers(tmp_path):
    """--from-json: the goal run's two parts (classification, then face and det) in one table; the
    workers line names the loader's workers of every workload, not only the first part's."""
    dev = os.path.join(ROOT, "docs", "dev")
    parts = [os.path.join(dev, f"benchmark_pipeline_h100_run6_{p}.json") for p in ("cls", "face_det")]
    md = tmp_path / "run.md"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "benchmark_pipeline.py"), "--from-json", *parts,
                          "--md", str(md)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    text = md.read_text()
    for workload in ("cls-500x375", "cls-1080p", "face", "det"):
        assert f"| {workload} | orbbec |" in text, workload
    assert "orbbec's loader workers: cls-500x375 12, cls-1080p 9, face 32, det 9." in text


def test_benchmark_table_names_each_workloads_rounds_when_merged_parts_had_different_counts(tmp_path):
    """A goal run's parts may take more rounds on some workloads (one workload per call): the merged
    table must not claim the first part's count for all of them."""
    dev = os.path.join(ROOT, "docs", "dev")
    parts = [os.path.join(dev, f"benchmark_pipeline_h200_run26_{p}.json") for p in ("cls", "face", "det")]
    md = tmp_path / "run.md"

    def merged(*files):
        run = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "benchmark_pipeline.py"), "--from-json",
                              *files, "--md", str(md)], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        return md.read_text()
    assert "the median of its 5 (cls-500x375), 5 (cls-1080p), 7 (face), 7 (det) alternated rounds" in merged(*parts)
    assert "the median of 7 alternated rounds" in merged(*parts[1:])
    assert "the median of 5 alternated rounds" in merged(parts[0])


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux's /proc/self/maps")
def test_mapped_library_names_a_loaded_library_and_none_for_an_absent_one():
    libc = mapped_library("libc.so") or mapped_library("libc-")
    assert libc is not None and os.path.exists(libc), "the C library is mapped into every Linux process"
    assert mapped_library("liborbbec-no-such-library") is None


def test_copy_load_copies_each_batchs_sources_in_turn_into_its_slots():
    """tools/dev/copy_load.py's copier: each batch the next BATCH sources (round and round), back to
    back in the next slot; it stops after the batches asked for and counts them."""
    import multiprocessing as mp

    import copy_load
    import numpy as np

    src = copy_load.sources(count=10, nbytes=100, seed=3)
    stop, done = mp.Event(), mp.Value("q", 0)
    slots = copy_load.copier(src, copy_load.BATCH, 1e6, stop, done, seed=0, batches=3)
    assert done.value == 3
    for n in range(3):
        first = n * copy_load.BATCH
        want = np.concatenate([src[(first + k) % 10] for k in range(copy_load.BATCH)])
        assert np.array_equal(slots[n][:want.size], want), n
    stop.set()
    assert copy_load.copier(src, copy_load.BATCH, 1e6, stop, done, seed=1, batches=5) is not None and done.value == 3


def test_engine_use_summarises_only_the_samples_inside_the_window():
    """tools/dev/engine_use.py: the means, extremes and count of the samples between t0 and t1 (NVML
    itself is absent here: the samples are set by hand), and a plain line where NVML cannot load."""
    import engine_use

    use = engine_use.EngineUse.__new__(engine_use.EngineUse)
    use.error = None
    use.samples = [(0.5, 10, 90), (1.0, 80, 20), (2.0, 100, None), (3.5, 0, 0)]
    line = use.summary(1.0, 3.0)
    assert "JPEG engines busy 90% (min 80, max 100, 2 distinct readings)" in line
    assert "SMs busy 20% (min 20, max 20, 1 distinct readings)" in line
    assert line.endswith("over 2 samples")
    use.samples = []
    assert "JPEG engines: no reading" in use.summary(0, 1)
    use.error = "no driver"
    assert use.summary(0, 1) == "engine use: unavailable (no driver)"


def test_collections_are_timed_by_generation_within_the_window():
    """tools/gc_pauses.py: each collection inside the with-block is recorded with its generation, and
    the summary counts only those that ended inside the window it is given."""
    import gc

    from gc_pauses import Collections

    was_enabled = gc.isenabled()
    gc.disable()  # only the collections below (explicit ones still run, and call the callbacks)
    try:
        with Collections() as gcs:
            gc.collect(0)
            t = time.perf_counter()
            gc.collect(2)
            gc.collect(1)
        gc.collect(2)  # after the block: not recorded
    finally:
        if was_enabled:
            gc.enable()
    assert [g for _, g, _, _ in gcs.records] == [0, 2, 1]
    assert all(s >= 0 for _, _, s, _ in gcs.records)
    line = gcs.summary()
    assert line.startswith("garbage collections gen 0: 1 (") and ", gen 1: 1 (" in line and ", gen 2: 1 (" in line
    assert line.endswith("full ones from MainThread")
    assert gcs.summary(t, float("inf")).startswith("garbage collections gen 0: 0, gen 1: 1 (")
