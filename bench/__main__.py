"""``python -m bench [--quick] [--no-peer] [--only a,b]``: run the suite, print the table, write results.

Order: the transport floor, omnitrio inline, omnitrio with one process per stage, then the
peer in its own venv as a subprocess — one after the other, so no two measurements share
the CPUs.  Writes ``bench/results/latest.{json,md}`` and a timestamped copy of the JSON,
then the chart ``latest.png`` when matplotlib (the ``bench`` extra) is installed; without it
the chart is skipped with one line.  ``--quick`` cuts sample counts and gives the process
and peer parts a time budget (benchmarks past it are recorded as skipped).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import trio

from bench import floor, report
from bench.measure import Progress, loadavg
from bench.peer import setup_venv

RESULTS = Path(__file__).resolve().parent / "results"
QUICK_TOTAL_S = 170.0


def machine() -> str:
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} CPUs, {mem_gib:.0f} GiB, Python {platform.python_version()}, {platform.machine()}"


WARM_MODULES = ("bench.toy_stages", "bench.toy_stream", "toys.seed.ch4_batch_stages", "toys.seed.ch4_fanin_stages")


def warm_imports() -> None:
    """Import the stage modules once, so the first pipeline's start-up is not charged with them."""
    for module in WARM_MODULES:
        importlib.import_module(module)


async def omnitrio_suites(args: argparse.Namespace, progress: Progress, t_start: float) -> dict[str, Any]:
    from bench.omni_runtime import OmniRuntime
    from bench.workloads import run_suite

    out: dict[str, Any] = {}
    out["omnitrio-inline"] = await run_suite(OmniRuntime(process=False), args.quick, progress, args.only)
    budget = None
    if args.quick:
        budget = progress.elapsed() + max(30.0, (QUICK_TOTAL_S - (time.perf_counter() - t_start)) / 2)
    out["omnitrio-processes"] = await run_suite(OmniRuntime(process=True), args.quick, progress, args.only, budget)
    return out


def run_peer(args: argparse.Namespace, progress: Progress, t_start: float) -> dict[str, Any]:
    """The same suite on the peer, in its venv, as a subprocess; its progress lines pass through."""
    if not setup_venv.is_ready():
        return {"unavailable": "peer venv not ready: run `python -m bench.peer setup` (it builds and checks it)"}
    out_file = RESULTS / "tmp" / "peer.json"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.unlink(missing_ok=True)
    cmd = [str(setup_venv.python()), "-m", "bench.peer.driver", "--out", str(out_file)]
    deadline = None
    if args.quick:
        remaining = QUICK_TOTAL_S - (time.perf_counter() - t_start)
        # The driver itself needs ~5-15 s to import torch and sglang_omni before its clock starts.
        cmd += ["--quick", "--budget-s", str(max(10.0, remaining - 40))]
        deadline = max(30.0, remaining + 5)
    if args.only:
        cmd += ["--only", ",".join(sorted(args.only))]
    t0 = progress.start("peer driver (subprocess)")
    code = run_filtered(cmd, deadline)
    progress.done("peer driver (subprocess)", t0, "stopped at the --quick deadline" if code is None else f"exit {code}")
    if not out_file.exists():
        return {"unavailable": f"peer driver exited with {code} before any result (its stderr is above)"}
    results: dict[str, Any] = json.loads(out_file.read_text())["results"]
    if code is None:
        results["deadline"] = {"skipped": f"the driver was stopped at the --quick deadline ({deadline:.0f} s)"}
    return results


# The peer prints these at every import (optional relay backends it does not need here).
_NOISE = ("Failed to import mooncake", "Failed to import nixl", "Failed to import torchada")


def run_filtered(cmd: list[str], deadline: float | None) -> int | None:
    """Run the peer driver, passing its stderr through minus import noise; None if stopped at ``deadline``."""
    proc = subprocess.Popen(
        cmd, cwd=RESULTS.parent.parent, env=setup_venv.peer_env(), stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    stderr = proc.stderr

    def forward() -> None:
        for line in stderr:
            if not line.startswith(_NOISE):
                sys.stderr.write(line)
                sys.stderr.flush()

    reader = threading.Thread(target=forward, name="peer-stderr", daemon=True)
    reader.start()
    try:
        code: int | None = proc.wait(timeout=deadline)
    except subprocess.TimeoutExpired:
        proc.terminate()  # its runners stop their stage processes on SIGTERM's KeyboardInterrupt path or die with it
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        code = None
    reader.join(timeout=5)
    return code


def write(doc: dict[str, Any]) -> list[Path]:
    """The results, the Markdown report and (with matplotlib) the chart; the files written, in order."""
    RESULTS.mkdir(exist_ok=True)
    latest = RESULTS / "latest.json"
    latest.write_text(json.dumps(doc, indent=1, default=str))
    stamp = doc["started"].replace(":", "").replace("-", "")
    shutil.copy(latest, RESULTS / f"{stamp}{'-quick' if doc['quick'] else ''}.json")
    (RESULTS / "latest.md").write_text(report.markdown(doc))
    written = [latest, RESULTS / "latest.md"]
    if draw_chart(doc):
        written.append(RESULTS / "latest.png")
    return written


def draw_chart(doc: dict[str, Any]) -> bool:
    """``latest.png`` from ``doc``; without matplotlib, one line saying so (the JSON and Markdown stand)."""
    try:
        report.chart(doc, RESULTS / "latest.png")
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] != "matplotlib":
            raise
        print("chart skipped: matplotlib is not installed (pip install -e '.[bench]' to draw latest.png)", flush=True)
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples; whole run under ~3 minutes")
    parser.add_argument("--no-peer", action="store_true", help="skip the SGLang-Omni comparison")
    parser.add_argument("--only", default="", help="comma-separated benchmark names (hop_latency, fan, ...)")
    parser.add_argument("--render", action="store_true", help="only redraw latest.md/png from latest.json")
    args = parser.parse_args()
    if args.render:
        saved = json.loads((RESULTS / "latest.json").read_text())
        (RESULTS / "latest.md").write_text(report.markdown(saved))
        draw_chart(saved)
        print(report.text_table(saved["results"]))
        return
    args.only = set(filter(None, args.only.split(","))) or None
    print(
        "omnitrio benchmarks. This machine may be shared with other work: every result records the load "
        "average, and figures move between runs. Nothing here asserts a timing.",
        flush=True,
    )
    t_start = time.perf_counter()
    progress = Progress("omnitrio")
    doc: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "quick": args.quick,
        "machine": machine(),
        "loadavg_start": loadavg(),
        "results": {},
    }
    warm_imports()
    t0 = progress.start("transport floor")
    doc["results"]["floor"] = floor.run(args.quick)
    progress.done("transport floor", t0)
    doc["results"].update(trio.run(omnitrio_suites, args, progress, t_start))
    if args.no_peer:
        doc["results"]["peer"] = {"unavailable": "skipped (--no-peer)"}
    else:
        doc["results"]["peer"] = run_peer(args, progress, t_start)
    doc["loadavg_end"] = loadavg()
    doc["wall_s"] = round(time.perf_counter() - t_start, 1)
    written = write(doc)
    print()
    print(report.text_table(doc["results"]))
    load = f"load {doc['loadavg_start']} → {doc['loadavg_end']}"
    print(f"\nwrote {', '.join(str(path) for path in written)} ({doc['wall_s']} s; {load})")


if __name__ == "__main__":
    main()
