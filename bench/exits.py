"""How fast every stage process leaves when the server is signalled with requests in flight, many times over.

For each shipped config (the default pipeline with one process per stage; each omni family served
with ``--model`` on a tiny random checkpoint, in the processes its config names) and each of SIGINT
and SIGTERM, ``--repeats`` times: serve, start streamed chat answers, transcriptions (and speech for
the default pipeline) and realtime sessions, signal once they are under way, and time each stage
process from the signal until it is gone (toys/signal_exit.py).  Prints per config and process the
median and slowest exit over all runs, and every run in which the server killed a process, exited
non-zero or left something behind.

Run: ``.venv/bin/python bench/exits.py [--repeats 10] [--configs speech qwen2.5-omni qwen3-omni]``
(``--quick``: one run each).  Writes ``bench/results/exits.json`` with the load average before and
after.  Not a test: nothing is asserted (tests/test_signal_exits.py asserts one run of each).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from omnitrio.families import FAMILIES, write_tiny_model  # noqa: E402
from toys.signal_exit import per_stage, serve_and_signal  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "exits.json"
SPEECH_STAGES = ["ingress", "asr", "stream_asr", "responder", "tts", "text_out"]


def serve_args(config: str, scratch: Path) -> tuple[list[str], tuple[str, ...]]:
    """The ``serve`` arguments of ``config`` and the request kinds it serves."""
    if config == "speech":
        args = ["--config", str(ROOT / "configs" / "speech.toml"), *per_stage(SPEECH_STAGES)]
        return args, ("chat", "transcription", "speech", "realtime")
    model = scratch / config
    if not model.exists():
        import torch

        torch.set_num_threads(1)
        write_tiny_model(config, model)
    return ["--model", str(model)], ("chat", "transcription", "realtime")


async def run(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    results: dict[str, Any] = {"load_avg_before": round(os.getloadavg()[0], 2), "repeats": args.repeats}
    for config in args.configs:
        command, kinds = serve_args(config, scratch)
        exits: dict[str, list[float]] = {}
        troubles: list[dict[str, Any]] = []
        for i in range(args.repeats):
            for signum in (signal.SIGINT, signal.SIGTERM):
                tmp = Path(tempfile.mkdtemp(dir=scratch))
                got = await serve_and_signal(command, signum, tmp, kinds=kinds)
                for name, seconds in got.processes.items():
                    exits.setdefault(name, []).append(float("inf") if seconds is None else seconds)
                if got.killed or got.server_code != 0 or got.leftovers or None in got.processes.values():
                    troubles.append({"run": i, "signal": signum.name, "killed": got.killed, "code": got.server_code})
                slowest = max((s for s in got.processes.values() if s is not None), default=float("nan"))
                print(f"{config:11} run {i + 1}/{args.repeats} {signum.name:7} slowest exit {slowest:.3f} s")
        results[config] = {
            "runs": 2 * args.repeats,
            "processes": {
                name: {"median_s": statistics.median(times), "slowest_s": max(times)} for name, times in exits.items()
            },
            "slowest_s": max(max(times) for times in exits.values()),
            "troubles": troubles,
        }
    results["load_avg_after"] = round(os.getloadavg()[0], 2)
    return results


def table(results: dict[str, Any], configs: list[str]) -> str:
    lines = [f"{'config':11} {'process':12} {'median s':>9} {'slowest s':>10}"]
    for config in configs:
        figures = results[config]
        for name, times in figures["processes"].items():
            lines.append(f"{config:11} {name:12} {times['median_s']:9.3f} {times['slowest_s']:10.3f}")
        lines.append(f"{config:11} {figures['runs']} runs, slowest exit {figures['slowest_s']:.3f} s")
        lines += [f"{config:11} trouble: {trouble}" for trouble in figures["troubles"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10, help="runs per config and signal")
    configs = ["speech", *sorted(FAMILIES)]
    parser.add_argument("--configs", nargs="+", default=configs, choices=configs)
    parser.add_argument("--quick", action="store_true", help="one run per config and signal")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.repeats = 1
    with tempfile.TemporaryDirectory(prefix="bench-exits-") as scratch:
        results = trio.run(run, args, Path(scratch))
    print(table(results, args.configs))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
