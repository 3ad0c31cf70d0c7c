"""The GPU's SM clock and power over a timed window, sampled by nvidia-smi in the background.

A step that takes longer on the GPU beside the decoder may be slower kernels (the SMs shared) or the
same kernels at a lower clock (the board at its power limit, so that the JPEG engines' power comes
out of the SMs'). The samples tell the two apart. Without nvidia-smi the sampler reports nothing.
"""
from __future__ import annotations

import shutil
import subprocess

import numpy as np

# Bits of nvidia-smi's clocks_event_reasons.active (nvml's clocksEventReasons).
POWER_CAP = 0x4
THERMAL = 0x20 | 0x40
FIELDS = "clocks.sm,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active"


class GpuClocks:
    """with GpuClocks(index) as c: ...; c.summary() -> str or None. `index` is nvidia-smi's numbering,
    which is CUDA's unless CUDA_VISIBLE_DEVICES reorders the devices."""

    def __init__(self, index: int = 0, period_ms: int = 100):
        self.index, self.period_ms, self.proc, self.rows = index, period_ms, None, []

    def __enter__(self):
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(
                ["nvidia-smi", "-i", str(self.index), f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits",
                 f"-lms={self.period_ms}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            out, _ = self.proc.communicate(timeout=10)
            self.rows = parse_rows(out)
        return False

    def summary(self):
        return summarize(self.rows)


def parse_rows(text: str):
    """(sm MHz, watts, limit watts, deg C, reasons bitmask) per well-formed line of nvidia-smi's csv."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            continue
        try:
            rows.append((float(parts[0]), float(parts[1]), float(parts[2]), float(parts[3]), int(parts[4], 16)))
        except ValueError:
            continue
    return rows


def summarize(rows):
    """One line: mean and lowest SM clock, mean power and limit, temperature, and the share of samples
    held at the power cap or slowed by heat; None without samples."""
    if not rows:
        return None
    a = np.array([r[:4] for r in rows])
    reasons = np.array([r[4] for r in rows])
    return (f"SM clock {a[:, 0].mean():,.0f} MHz (min {a[:, 0].min():,.0f}), power {a[:, 1].mean():.0f} W "
            f"of {a[:, 2].mean():.0f} W, {a[:, 3].mean():.0f} C; power cap in {np.mean(reasons & POWER_CAP > 0):.0%}"
            f", thermal in {np.mean(reasons & THERMAL > 0):.0%} of {len(rows)} samples")
