"""``python -m bench.call_count [--trees DIR ...]``: the Python work per streamed chunk and per hop.

Wall-clock figures on a shared machine move by ±50 % between identical runs; the number of
function calls a fixed workload makes does not depend on the load, and the CPU time it
takes depends on it much less.  This runs fixed inline workloads (the streaming, chain and
fan pipelines of ``python -m bench``, driven through the same ``OmniRuntime``) in a fresh
interpreter per tree, with that tree first on ``PYTHONPATH``, so two commits can be compared
in one sitting (``--trees /path/to/old/worktree .``), interleaved run by run.

Two kinds of child run:

* ``calls``: a profile hook (``sys.setprofile`` and ``threading.setprofile``, so scheduler
  and pump threads count too) counts Python function calls (a coroutine or generator
  resumed counts as a call, as the profiler sees it) and C calls during each workload.
  Printed per unit: per streamed chunk, per request through 1 and 4 stages (and per extra
  hop: the difference / 3), per fan request; plus the functions called most per unit.
* ``cpu``: no hook; ``time.process_time`` (every thread of the process: inline runs are one
  process), wall time and voluntary context switches (a thread blocking: wake-ups the call
  count does not show) per workload, larger workloads, repeated ``--runs`` times.

Results go to ``call-count-<stamp>.{json,md}`` in ``--out`` (``bench/results``) with the load
average before and after each child run.  Counts still move a little between runs: how many chunks
one wake-up of the trio side finds waiting depends on thread timing.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
RESULTS = HERE.parent / "results"
# (workload, unit): requests (or chunks) measured in each kind of run.
SIZES = {
    "calls": {"stream_c1": 20, "stream_c16": 48, "chain1": 300, "chain4": 300, "fan": 300},
    "cpu": {"stream_c1": 60, "stream_c16": 160, "chain1": 1500, "chain4": 1500, "fan": 1500},
}
AREA = "/omnitrio/"
"""Python calls in files under this folder are the runtime's own (the rest: trio, schedulers, stdlib)."""
UNITS = {"stream_c1": "chunk", "stream_c16": "chunk", "chain1": "request", "chain4": "request", "fan": "request"}


class CallCounter:
    """Counts profile events by function in every thread started after :meth:`install`."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._tables: list[collections.Counter[str]] = []
        self._lock = threading.Lock()

    def _table(self) -> collections.Counter[str]:
        table: collections.Counter[str] | None = getattr(self._local, "table", None)
        if table is None:
            table = self._local.table = collections.Counter()
            with self._lock:
                self._tables.append(table)
        return table

    def _hook(self, frame: Any, event: str, arg: Any) -> None:
        match event:
            case "call":
                code = frame.f_code
                self._table()[f"py {code.co_filename}:{code.co_firstlineno}({code.co_qualname})"] += 1
            case "c_call":
                owner = getattr(arg, "__self__", None)
                kind = type(owner).__name__ + "." if owner is not None and not isinstance(owner, type) else ""
                self._table()[f"c {kind}{getattr(arg, '__qualname__', repr(arg))}"] += 1

    def install(self) -> None:
        threading.setprofile(self._hook)
        sys.setprofile(self._hook)

    def snapshot(self) -> collections.Counter[str]:
        total: collections.Counter[str] = collections.Counter()
        with self._lock:
            tables = list(self._tables)
        for table in tables:
            while True:
                try:
                    total.update(dict(table))
                    break
                except RuntimeError:  # the owning thread added a key while we copied
                    continue
        return total


def short(key: str) -> str:
    """``py omnitrio/stage_request.py:120(StageRequest.outputs)`` instead of the absolute path."""
    kind, _, where = key.partition(" ")
    for marker in ("/site-packages/", "/lib/python3"):
        if marker in where:
            where = where.split(marker, 1)[1]
            break
    else:
        for root in sys.path:
            if root and where.startswith(root.rstrip("/") + "/"):
                where = where[len(root.rstrip("/")) + 1 :]
                break
    return f"{kind} {where}"


async def workloads(
    sizes: dict[str, int], measure: Callable[[str, int, Callable[[], Awaitable[None]]], Awaitable[None]]
) -> None:
    """Open each pipeline inline, warm it, then hand ``measure`` the fixed workload."""
    import trio

    from bench import pipelines
    from bench.omni_runtime import OmniRuntime

    rt = OmniRuntime(process=False)
    counter = iter(range(10**9))

    async def stream_one(api: Any) -> int:
        chunks = 0
        async with api.stream(f"s{next(counter)}", "say something") as s:
            async for msg in s:
                chunks += api.is_chunk(msg)
        return chunks

    async with rt.open(pipelines.talker_vocoder(rt.classes, process=False)) as (api, _):
        for _ in range(3):
            await stream_one(api)

        async def stream_c1() -> None:
            for _ in range(sizes["stream_c1"]):
                await stream_one(api)

        async def stream_c16() -> None:
            async with trio.open_nursery() as nursery:
                for lane in range(16):
                    nursery.start_soon(lambda lane=lane: _lane(lane))

        async def _lane(lane: int) -> None:
            for _ in range(lane, sizes["stream_c16"], 16):
                await stream_one(api)

        await measure("stream_c1", sizes["stream_c1"] * 100, stream_c1)
        await measure("stream_c16", sizes["stream_c16"] * 100, stream_c16)

    async def requests(api: Any, inputs: str, n: int) -> None:
        for _ in range(n):
            await api.submit(f"r{next(counter)}", inputs)

    for stages in (1, 4):
        name = f"chain{stages}"
        async with rt.open(pipelines.chain(rt.classes, stages, process=False)) as (api, _):
            await requests(api, "x", 30)
            await measure(name, sizes[name], functools.partial(requests, api, "x", sizes[name]))
    async with rt.open(pipelines.fan(rt.classes, rt.fanin_module, process=False)) as (api, _):
        await requests(api, "hello omni world", 30)
        await measure("fan", sizes["fan"], functools.partial(requests, api, "hello omni world", sizes["fan"]))


def child(kind: str) -> dict[str, Any]:
    """One run in this interpreter: counts (``calls``) or CPU and wall seconds (``cpu``) per workload."""
    import trio

    out: dict[str, Any] = {}
    counter = CallCounter()
    if kind == "calls":
        counter.install()

    async def measure(name: str, units: int, work: Callable[[], Awaitable[None]]) -> None:
        before = counter.snapshot()
        switches0 = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await work()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - switches0
        if kind == "cpu":
            out[name] = {
                "units": units,
                "cpu_us_per_unit": cpu / units * 1e6,
                "wall_us_per_unit": wall / units * 1e6,
                "waits_per_unit": switches / units,
            }
            return
        diff = counter.snapshot() - before
        py = sum(v for k, v in diff.items() if k.startswith("py "))
        c = sum(v for k, v in diff.items() if k.startswith("c "))
        top = [[short(k), round(v / units, 3)] for k, v in diff.most_common(40)]
        ours = sum(v for k, v in diff.items() if k.startswith("py ") and AREA in k)
        out[name] = {
            "units": units,
            "py_per_unit": py / units,
            "omnitrio_per_unit": ours / units,
            "c_per_unit": c / units,
            "top": top,
        }

    trio.run(workloads, SIZES[kind], measure)
    return out


def run_child(tree: Path, kind: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    load = [round(x, 2) for x in os.getloadavg()]
    done = subprocess.run(
        [sys.executable, "-P", str(HERE), "--child", kind], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(f"{kind} run in {tree} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return {
        "tree": str(tree),
        "kind": kind,
        "load_before": load,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        **result,
    }


def commit_of(tree: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or tree.name


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def table(runs: list[dict[str, Any]], labels: dict[str, str]) -> str:
    trees = list(labels)
    head = "| workload | unit | figure | " + " | ".join(labels[t] for t in trees) + " |"
    lines = [head, "|" + "---|" * (3 + len(trees))]
    for name, unit in UNITS.items():
        for kind, key, what in (
            ("calls", "py_per_unit", "Python calls"),
            ("calls", "omnitrio_per_unit", "of them in omnitrio/"),
            ("calls", "c_per_unit", "C calls"),
            ("cpu", "cpu_us_per_unit", "CPU µs"),
            ("cpu", "wall_us_per_unit", "wall µs"),
            ("cpu", "waits_per_unit", "voluntary context switches"),
        ):
            cells = [spread([r[name][key] for r in runs if r["tree"] == t and r["kind"] == kind]) for t in trees]
            lines.append(f"| {name} | per {unit} | {what} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", type=Path, default=[Path.cwd()], help="checkouts to compare")
    parser.add_argument("--runs", type=int, default=3, help="interleaved runs of each kind per tree")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results")
    parser.add_argument("--child", choices=["calls", "cpu"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    trees = [t.resolve() for t in args.trees]
    labels = {str(t): commit_of(t) for t in trees}
    runs: list[dict[str, Any]] = []
    for i in range(args.runs):
        for kind in ("calls", "cpu"):
            for tree in trees if i % 2 == 0 else reversed(trees):
                runs.append(run_child(tree, kind))
                print(f"run {i + 1} {kind:5} {labels[str(tree)]}: load {runs[-1]['load_before']}", flush=True)
    text = table(runs, labels)
    print(text)
    for tree in trees:
        for name in UNITS:
            last = next(r for r in reversed(runs) if r["tree"] == str(tree) and r["kind"] == "calls")
            print(f"\n{labels[str(tree)]} {name}: most called per {UNITS[name]}")
            for where, n in last[name]["top"][:12]:
                print(f"  {n:8.2f}  {where}")
    stamp = time.strftime("%Y%m%dT%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"call-count-{stamp}.json").write_text(json.dumps({"labels": labels, "runs": runs}))
    loads = [r["load_before"][0] for r in runs]
    header = (
        f"`python -m bench.call_count --runs {args.runs}`, {stamp}, 1-minute load average "
        f"{min(loads)}–{max(loads)}; each cell: median (min–max) over the runs.\n\n"
    )
    (args.out / f"call-count-{stamp}.md").write_text(header + text + "\n")


if __name__ == "__main__":
    main()
