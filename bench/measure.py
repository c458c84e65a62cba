"""Measurement helpers shared by the omnitrio suite and the peer driver (stdlib only).

The peer's venv has none of omnitrio's dependencies, so nothing here imports beyond the
standard library.  Figures are summaries of raw samples; nothing here judges them.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

MIB = 1024 * 1024


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) by linear interpolation; NaN for no samples."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def latency_ms(samples_s: Sequence[float]) -> dict[str, float]:
    """p50/p99/mean in milliseconds of samples given in seconds."""
    ms = [s * 1000 for s in samples_s]
    return {
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "mean_ms": statistics.fmean(ms) if ms else math.nan,
        "n": len(ms),
    }


def median_runs(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per numeric key: the median over runs, plus ``[min, max]`` under ``<key>_range`` when runs > 1."""
    if len(runs) == 1:
        return dict(runs[0])
    merged: dict[str, Any] = {}
    for key, first in runs[0].items():
        values = [r[key] for r in runs if key in r]
        if isinstance(first, (int, float)) and not isinstance(first, bool):
            merged[key] = statistics.median(values)
            merged[f"{key}_range"] = [min(values), max(values)]
        else:
            merged[key] = first
    merged["runs"] = len(runs)
    return merged


def loadavg() -> list[float]:
    """The 1/5/15-minute load averages, recorded next to every result (the machine is shared)."""
    return [round(x, 2) for x in os.getloadavg()]


def vm_rss_mib(pid: int) -> float | None:
    """``VmRSS`` of ``pid`` in MiB from /proc, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def process_table() -> dict[int, tuple[int, float]]:
    """Every live process's parent and CPU seconds so far (user and system), read from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    table: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        table[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)  # ppid, utime + stime
    return table


def child_pids(parent: int | None = None) -> list[int]:
    """Direct children of ``parent`` (default: this process), read from /proc."""
    parent = os.getpid() if parent is None else parent
    return sorted(pid for pid, (ppid, _) in process_table().items() if ppid == parent)


def shm_entries() -> set[str]:
    """Names in /dev/shm, to report segments a run left behind."""
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


class Progress:
    """One line per benchmark started and finished, with the suite's elapsed time."""

    def __init__(self, tag: str, out: TextIO = sys.stderr) -> None:
        self.tag = tag
        self.out = out
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def start(self, name: str) -> float:
        print(f"[{self.elapsed():7.1f}s] {self.tag:<18} start {name}", file=self.out, flush=True)
        return time.perf_counter()

    def done(self, name: str, started: float, note: str = "") -> None:
        took = time.perf_counter() - started
        suffix = f"  {note}" if note else ""
        print(f"[{self.elapsed():7.1f}s] {self.tag:<18} done  {name} ({took:.1f}s){suffix}", file=self.out, flush=True)


def fmt(value: Any, digits: int = 3) -> str:
    """Compact numeric formatting for tables: 3 significant figures, '–' for missing."""
    match value:
        case None:
            return "–"
        case bool():
            return str(value)
        case int() | float() if math.isnan(value):
            return "–"
        case int() | float() if abs(value) >= 100:
            return f"{value:,.0f}"
        case int() | float():
            return f"{value:.{digits}g}"
        case _:
            return str(value)


def ratio(ours: float | None, peer: float | None, *, higher_is_better: bool) -> float | None:
    """How many times better omnitrio is than the peer (>1 = omnitrio better); None if unknown."""
    if ours is None or peer is None or not ours or not peer or math.isnan(ours) or math.isnan(peer):
        return None
    return ours / peer if higher_is_better else peer / ours
