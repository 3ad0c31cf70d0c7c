"""Per-core CPU time and interrupts while a command runs (Linux /proc), to see which core takes the
GPU's interrupts and how busy each core was:

    python3 tools/dev/core_interrupts.py python3 tools/dev/loader_stage_probe.py --workload face --per-worker

prints each core's ticks (user, nice, system, idle, iowait, irq, softirq, steal) spent during the
command, then the busiest interrupt lines with their count per core. Its exit status is the command's.
With loader_stage_probe.py --per-worker (which names each worker's usual core) it found face's late
worker: the one on the core that took the JPEG engine's interrupts (docs/dev/decode.md).
"""
from __future__ import annotations

import subprocess
import sys
from typing import Dict, List

STAT_FIELDS = "user nice system idle iowait irq softirq steal"


def core_ticks(text: str) -> Dict[str, List[int]]:
    """/proc/stat's per-core lines -> {"cpu0": [user, nice, system, idle, iowait, irq, softirq, steal]}."""
    out = {}
    for line in text.splitlines():
        f = line.split()
        if f and f[0].startswith("cpu") and f[0] != "cpu":
            out[f[0]] = [int(x) for x in f[1:9]]
    return out


def interrupt_counts(text: str) -> Dict[str, List[int]]:
    """/proc/interrupts -> {"42: <its name>": [count on core 0, core 1, ...]}."""
    lines = text.splitlines()
    cores = len(lines[0].split())
    out = {}
    for line in lines[1:]:
        f = line.split()
        counts = [int(x) for x in f[1:1 + cores] if x.isdigit()]
        out[(f[0] + " " + " ".join(f[1 + len(counts):])).strip()[:60]] = counts
    return out


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def report(before_stat, after_stat, before_irq, after_irq, lines: int = 8) -> str:
    rows = [f"core: {STAT_FIELDS} (ticks during the command)"]
    for core, ticks in before_stat.items():
        rows.append(f"{core} {[b - a for a, b in zip(ticks, after_stat.get(core, ticks))]}")
    busiest = []
    for name, counts in before_irq.items():
        if name in after_irq:
            delta = [b - a for a, b in zip(counts, after_irq[name])]
            busiest.append((sum(delta), name, delta))
    rows.append("busiest interrupt lines: total, line, per core")
    for total, name, delta in sorted(busiest, key=lambda r: -r[0])[:lines]:
        rows.append(f"{total} {name} {delta}")
    return "\n".join(rows)


def main(argv: List[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    s0, i0 = core_ticks(_read("/proc/stat")), interrupt_counts(_read("/proc/interrupts"))
    rc = subprocess.call(argv)
    s1, i1 = core_ticks(_read("/proc/stat")), interrupt_counts(_read("/proc/interrupts"))
    print(report(s0, s1, i0, i1), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
