"""Where a pipeline's start-up seconds go, per stage process, with the fork server and without it.

Two pipelines, each stage process its own: the 4-stage torch-importing chain (every stage module
imports torch and transformers, bench/startup_stages.py) and tiny Qwen3-Omni (configs/qwen3-omni.toml
on a random tiny checkpoint, in the processes the config names), each a TOML file.  Each run is a
fresh Python process that starts the file as ``omnitrio serve`` does: it loads the config (the
caller's own imports, reported apart), opens the pipeline and asks ``health()``; ``healthy`` counts
from the run's first line to that answer (``open_pipeline to healthy`` apart), with start-up events
on (omnitrio.events).  Per stage process the events split its start into:

* ``interpreter``: from the caller starting it until its first line of Python ran (a fork: until
  the fork server forked it, which includes waiting for the server's preload);
* ``runtime import``: omnitrio's own modules (nothing for a fork);
* ``handshake``: binding its socket and naming its peers, plus from its ``Ready`` until the caller
  heard it;
* ``factory imports``: the modules its stages' factories live in (torch, transformers, model code);
* ``model load``: the slowest of its stages' factory calls; ``warm-up``: the slowest warm-up after it.

With the fork server, its own row says when its interpreter ran (from the run's first line) and how
long its preload took (as ``factory imports``).  Every ``total`` counts from the run's first line.  ``CPU``
is the user and system time of the run's every process from start to stop (what a loaded machine's
other processes do not add to).

Beside each pipeline's runs, interleaved with them, its ``import floor``: a fresh interpreter that only
imports, in order, the modules the fork server preloads for it (torch, transformers, the model code)
and exits — what any start of a process that runs those stages pays before its first line of work, on
this machine (``floor_s``, median; ``healthy`` minus it is what the runtime and the models add).

Three methods: ``spawn`` (fresh interpreters, ``OMNITRIO_START_METHOD=spawn``), ``fork-late`` (the
fork server starts when the pipeline opens, after the config load) and ``fork-early`` (it starts
before the config load, as the CLI starts it: :func:`omnitrio.start_method.start_fork_server_early`).
``--methods`` (all by default) runs each pipeline each way in turn, ``--repeats`` times, so before
and after are measured in one sitting.  Prints medians
and writes ``bench/results/startup.json`` with the load average before and after.  ``--quick``: one
run each.  Not a test: nothing is asserted.

Run: ``.venv/bin/python bench/startup.py [--repeats 5] [--pipelines chain4 qwen3-omni]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results" / "startup.json"
PIPELINES = ("chain4", "qwen3-omni")
METHODS = ("spawn", "fork-late", "fork-early")
START_METHOD = {"spawn": "spawn", "fork-late": "forkserver", "fork-early": "forkserver"}
PHASES = ("interpreter", "runtime import", "handshake", "factory imports", "model load", "warm-up", "total")
TARGETS_S = {"chain4": 2.0, "qwen3-omni": 8.0}
QWEN3_OMNI = ROOT / "configs" / "qwen3-omni.toml"


CHAIN4_STAGE = """
[[stages]]
name = "s{i}"
process = "p_s{i}"
factory_path = "bench.startup_stages.create_torch_stage"
"""


def chain4_config(scratch: Path) -> Path:
    """The 4-stage chain as a TOML file, so that it starts as ``omnitrio serve`` starts a file."""
    stages = [CHAIN4_STAGE.format(i=i) + (f'next = "s{i + 1}"\n' if i < 3 else "terminal = true\n") for i in range(4)]
    path = scratch / "chain4.toml"
    path.write_text('name = "chain4"\n' + "".join(stages))
    return path


def run_one(pipeline: str, model: str, out: Path, early: bool) -> None:
    """One start in this process (``--one``), as ``omnitrio serve`` starts: load the config (``early``:
    its fork server starting first, as the CLI does), open the pipeline, ask its health."""
    began_ns = time.monotonic_ns()
    began = time.perf_counter()
    from omnitrio.cli import load_config
    from omnitrio.config_loading import load

    path, model_dir = (chain4_config(out.parent), None) if pipeline == "chain4" else (QWEN3_OMNI, Path(model))
    if early:
        config = load_config(path, [], model_dir, to_start=True)
    else:  # validated as serve validates: a stage process checks its own factories
        config = load(path, [], model_dir, process_factories=False)
    loaded = time.perf_counter()
    import trio

    from omnitrio import open_pipeline

    async def start() -> dict[str, Any]:
        opened_ns = time.monotonic_ns()
        async with open_pipeline(config) as running:
            health = await running.health()
            healthy_ns = time.monotonic_ns()
        assert all(stage["alive"] for stage in health["stages"].values()), health
        return {"began_ns": began_ns, "opened_ns": opened_ns, "healthy_ns": healthy_ns}

    figures = trio.run(start)
    figures["config_load_s"] = loaded - began
    out.write_text(json.dumps(figures))


FLOOR = (
    "import sys, time; began = time.perf_counter(); import importlib; "
    "[importlib.import_module(m) for m in sys.argv[1:]]; print(time.perf_counter() - began)"
)


def import_floor(path: Path) -> float:
    """Seconds from spawning a fresh interpreter until it has imported what the fork server preloads for
    the pipeline in ``path`` (its own start counted, as a stage process's is)."""
    from omnitrio.config_loading import process_factory_paths
    from omnitrio.forkserver import preload_modules

    modules = preload_modules(process_factory_paths(path))
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", FLOOR, *modules], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - began


def phases(events_dir: Path, began_ns: int) -> dict[str, dict[str, float]]:
    """Per stage process, the seconds of each phase (module docstring) from its start-up events."""
    import msgspec

    from omnitrio import events as ev

    decoder = msgspec.json.Decoder(ev.Event)
    found: list[ev.Event] = []
    for path in events_dir.glob(ev.FILE_PATTERN):
        found += [decoder.decode(line) for line in path.read_bytes().splitlines() if line]
    at: dict[str, dict[str, int]] = defaultdict(dict)
    stages: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: defaultdict(dict))
    server: dict[str, int] = {}
    for e in found:
        if e.request_id is not None:
            continue
        if e.process == "main":
            if e.event in (ev.PROCESS_SPAWNED, ev.PROCESS_READY):
                at[str(e.fields["process"])]["parent " + e.event] = e.t_ns
            elif e.event in (ev.FORK_SERVER_UP, ev.FORK_SERVER_PRELOADED):
                server[e.event] = e.t_ns
            continue
        if e.stage is None:
            at[e.process].setdefault(e.event, e.t_ns)
        else:
            stages[e.process][e.stage].setdefault(e.event, e.t_ns)
    out: dict[str, dict[str, float]] = {}
    if len(server) == 2:  # its interpreter counts from open_pipeline; its preload is its factory imports
        up, preloaded = server[ev.FORK_SERVER_UP], server[ev.FORK_SERVER_PRELOADED]
        figures = {"interpreter": (up - began_ns) / 1e9, "factory imports": (preloaded - up) / 1e9}
        out["fork server"] = {phase: figures.get(phase, 0.0) for phase in PHASES} | {
            "total": (preloaded - began_ns) / 1e9
        }
    for process, t in sorted(at.items()):
        built = stages[process].values()

        def s(ns: int) -> float:
            return ns / 1e9

        out[process] = {
            "interpreter": s(t[ev.PROCESS_INTERPRETER_UP] - t["parent " + ev.PROCESS_SPAWNED]),
            "runtime import": s(t[ev.PROCESS_RUNTIME_IMPORTED] - t[ev.PROCESS_INTERPRETER_UP]),
            "handshake": s(
                t[ev.PROCESS_LISTENING]
                - t[ev.PROCESS_RUNTIME_IMPORTED]
                + t["parent " + ev.PROCESS_READY]
                - t[ev.PROCESS_READY]
            ),
            "factory imports": s(t[ev.PROCESS_FACTORIES_IMPORTED] - t[ev.PROCESS_LISTENING]),
            "model load": s(max(b[ev.STAGE_BUILT] - b[ev.STAGE_BUILD_BEGAN] for b in built)),
            "warm-up": s(max(b[ev.STAGE_WARM] - b[ev.STAGE_BUILT] for b in built)),
            "total": s(t["parent " + ev.PROCESS_READY] - began_ns),
        }
    return out


def measure(pipeline: str, method: str, model: str, scratch: Path) -> dict[str, Any]:
    """One fresh-process start of ``pipeline`` with ``method``: its figures and per-process phases."""
    run_dir = Path(tempfile.mkdtemp(dir=scratch))
    out = run_dir / "figures.json"
    env = {**os.environ, "OMNITRIO_EVENT_DIR": str(run_dir / "events"), "OMNITRIO_START_METHOD": START_METHOD[method]}
    command = [sys.executable, __file__, "--one", pipeline, "--model", model, "--out", str(out)]
    if method == "fork-early":
        command.append("--early")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, env=env, cwd=ROOT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    figures = json.loads(out.read_text())
    return {
        "healthy_s": (figures["healthy_ns"] - figures["began_ns"]) / 1e9,
        "opened_to_healthy_s": (figures["healthy_ns"] - figures["opened_ns"]) / 1e9,
        "config_load_s": figures["config_load_s"],
        "cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
        "processes": phases(run_dir / "events", figures["began_ns"]),
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by_process: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        for process, figures in run["processes"].items():
            for phase, seconds in figures.items():
                by_process[process][phase].append(seconds)
    return {
        "runs": len(runs),
        "healthy_s": statistics.median(r["healthy_s"] for r in runs),
        "healthy_s_all": [round(r["healthy_s"], 3) for r in runs],
        "opened_to_healthy_s": statistics.median(r["opened_to_healthy_s"] for r in runs),
        "config_load_s": statistics.median(r["config_load_s"] for r in runs),
        "cpu_s": statistics.median(r["cpu_s"] for r in runs),
        "processes": {
            process: {phase: statistics.median(values) for phase, values in figures.items()}
            for process, figures in by_process.items()
        },
    }


def table(results: dict[str, Any]) -> str:
    lines = []
    for pipeline in results["pipelines"]:
        floor = results["floor_s"][pipeline]
        lines.append(f"{pipeline} import floor (a fresh interpreter importing the preload): {floor:.2f} s")
        for method, figures in results[pipeline].items():
            target = TARGETS_S[pipeline]
            lines.append(
                f"{pipeline} / {method}: healthy {figures['healthy_s']:.2f} s (median of {figures['runs']}; "
                f"target {target:g} s): the caller's config load {figures['config_load_s']:.2f} s, "
                f"open_pipeline to healthy {figures['opened_to_healthy_s']:.2f} s; "
                f"CPU of every process, start to stop, {figures['cpu_s']:.2f} s"
            )
            lines.append("  " + f"{'process':12}" + "".join(f"{phase:>16}" for phase in PHASES))
            for process, phase_s in figures["processes"].items():
                lines.append("  " + f"{process:12}" + "".join(f"{phase_s[p]:16.3f}" for p in PHASES))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipelines", nargs="+", default=list(PIPELINES), choices=PIPELINES)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one run of each pipeline and method")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--one", choices=PIPELINES, help=argparse.SUPPRESS)
    parser.add_argument("--model", default="", help=argparse.SUPPRESS)
    parser.add_argument("--early", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        run_one(args.one, args.model, args.out, args.early)
        return
    if args.quick:
        args.repeats = 1
    results: dict[str, Any] = {"load_avg_before": round(os.getloadavg()[0], 2), "pipelines": args.pipelines}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as scratch_dir:
        scratch = Path(scratch_dir)
        model = ""
        if "qwen3-omni" in args.pipelines:
            model = str(write_tiny_checkpoint(scratch))
        for pipeline in args.pipelines:
            runs: dict[str, list[dict[str, Any]]] = {method: [] for method in args.methods}
            path = chain4_config(scratch) if pipeline == "chain4" else QWEN3_OMNI
            floors = []
            for i in range(args.repeats):
                floors.append(import_floor(path))
                print(f"{pipeline:10} {'floor':10} run {i + 1}/{args.repeats}: imports {floors[-1]:.2f} s")
                for method in args.methods:
                    run = measure(pipeline, method, model, scratch)
                    runs[method].append(run)
                    print(f"{pipeline:10} {method:10} run {i + 1}/{args.repeats}: healthy {run['healthy_s']:.2f} s")
            results[pipeline] = {method: summarize(found) for method, found in runs.items()}
            results["floor_s"] = results.get("floor_s", {}) | {pipeline: statistics.median(floors)}
    results["load_avg_after"] = round(os.getloadavg()[0], 2)
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


def write_tiny_checkpoint(scratch: Path) -> Path:
    code = (
        "import sys, torch; from pathlib import Path; torch.set_num_threads(1); "
        "from schedulers.qwen3_omni.tiny import write_checkpoint; write_checkpoint(Path(sys.argv[1]), size='tiny')"
    )
    subprocess.run([sys.executable, "-c", code, str(scratch / "tiny")], check=True, cwd=ROOT)
    return scratch / "tiny"


if __name__ == "__main__":
    main()
