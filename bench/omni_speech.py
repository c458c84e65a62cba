"""What the omni families' speech benches share (bench/qwen3_omni.py, bench/qwen2_5_omni.py).

Each bench times transformers' ``generate(return_audio=True)`` one prompt after another (batch 1; it is not
streaming, so its time to first audio is its whole time) with :func:`time_generate`, then a served
pipeline at each concurrency with :func:`run_pipeline`: time to first audio (submit → first pcm chunk),
audio seconds produced per wall second and the cores the pipeline kept busy meanwhile, and start-up until
every stage answers health (:func:`run_sizes` does both for each checkpoint size).  :func:`arguments` holds
the flags both take, :func:`finish` prints the table (ratios against ``generate``, the issue's targets beside
them) and writes the results with the load average before and after.  Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import trio

from bench.measure import process_table
from omnitrio import StreamMessage, open_pipeline
from omnitrio.config import PipelineConfig

RATE = 24_000
TARGETS = {"ttfa_at_1_vs_generate_max": 0.25, "audio_per_wall_at_8_vs_generate_min": 3.0}
Inputs = Callable[[int], dict[str, Any]]  # the i-th request's raw pipeline inputs


def arguments(doc: str, results: Path) -> argparse.ArgumentParser:
    """The flags both benches take; ``--quick`` is applied by :func:`quick`."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "medium"], choices=["tiny", "medium"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 8])
    parser.add_argument("--tokens", type=int, default=24, help="thinker tokens per answer (max_tokens)")
    parser.add_argument("--frames", type=int, default=96, help="talker tokens per answer at most")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--quick", action="store_true", help="tiny only, 1 and 4 requests, short answers")
    parser.add_argument("--set", action="append", default=[], help="a config override, as serve's --set")
    parser.add_argument("--out", type=Path, default=results)
    return parser


def quick(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with ``--quick``'s sizes, concurrency and caps when it was given."""
    if args.quick:
        args.sizes, args.concurrency, args.tokens, args.frames = ["tiny"], [1, 4], 12, 32
    return args


def time_generate(
    generate: Callable[[int, int, int], Any], count: int, tokens: int, frames: int, device: str
) -> dict[str, Any]:
    """``generate(i, tokens, frames)`` (the i-th prompt; its waveform back, or None) for i < ``count`` in
    turn, after one short warm-up call: seconds each (to the waveform on the host's hands: CUDA
    synchronised), audio seconds each."""
    generate(0, 2, 4)
    seconds, audio = [], []
    for i in range(count):
        start = time.perf_counter()
        wav = generate(i, tokens, frames)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
        audio.append(0.0 if wav is None else wav.numel() / RATE)
    return {
        "requests": count,
        "time_to_audio_s": statistics.mean(seconds),
        "audio_s_per_wall_s": sum(audio) / sum(seconds),
        "audio_s_per_request": statistics.mean(audio),
        "seconds": seconds,
        "audio_s": audio,
    }


async def one_request(pipeline: Any, rid: str, inputs: dict[str, Any], start: float) -> tuple[float, float]:
    """(seconds from ``start`` to the first audio chunk, audio seconds) of one request."""
    first, samples = None, 0
    async with pipeline.stream(rid, inputs) as stream:
        async for message in stream:
            if isinstance(message, StreamMessage) and message.modality == "audio":
                first = first if first is not None else time.perf_counter() - start
                samples += len(message.chunk["pcm"])
    return (first if first is not None else float("nan")), samples / RATE


def tree_cpu_s() -> float:
    """CPU seconds used so far by this process and every live process below it (the fork server, the stage
    processes)."""
    table = process_table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    total, below = 0.0, [os.getpid()]
    while below:
        pid = below.pop()
        total += table.get(pid, (0, 0.0))[1]
        below += children.get(pid, [])
    return total


def stage_pids(health: dict[str, Any]) -> dict[str, int]:
    """Each process of a pipeline by its name (``group.i`` for a replicated group's copies), from its health;
    inline stages share this process's."""
    pids: dict[str, int] = {}
    for entry in health["stages"].values():
        for copy in entry.get("replicas", [entry]):
            pids[copy["process"]] = copy["pid"]
    return pids


def cpu_by_process(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process."""
    table = process_table()
    return {name: table.get(pid, (0, 0.0))[1] for name, pid in pids.items()}


async def at_once(pipeline: Any, level: int, name: str, inputs: Inputs, pids: dict[str, int]) -> dict[str, Any]:
    """``level`` requests ``inputs(0..level-1)`` submitted together: mean time to first audio, audio
    seconds per wall second, wall seconds, each request's audio seconds (``audio_s``, in ``i`` order: the
    same answer as ``generate``'s for the same prompt is as long), the CPU seconds every process of the
    pipeline used meanwhile (``cores_busy``: per wall second; the machine's cores when it is CPU-bound) and
    each stage process's share of them (``cpu_s_by_process``; ``pids`` names the processes)."""
    answers: dict[int, tuple[float, float]] = {}
    each, cpu, begin = cpu_by_process(pids), tree_cpu_s(), time.perf_counter()

    async def run(i: int) -> None:
        answers[i] = await one_request(pipeline, f"{name or 'c'}{level}-{i}", inputs(i), begin)

    async with trio.open_nursery() as nursery:
        for i in range(level):
            nursery.start_soon(run, i)
    wall, cpu = time.perf_counter() - begin, tree_cpu_s() - cpu
    each = {process: used - each[process] for process, used in cpu_by_process(pids).items()}
    audio = [answers[i][1] for i in range(level)]
    return {
        "cpu_s": cpu,
        "cores_busy": cpu / wall,
        "cpu_s_by_process": dict(sorted(each.items(), key=lambda item: -item[1])),
        "requests": level,
        "time_to_first_audio_s": statistics.mean(a[0] for a in answers.values()),
        "audio_s_per_wall_s": sum(audio) / wall,
        "wall_s": wall,
        "audio_s_per_request": statistics.mean(audio),
        "audio_s": audio,
    }


async def run_pipeline(
    config: PipelineConfig, levels: list[int], variants: dict[str, Inputs], warm: dict[str, Any]
) -> dict[str, Any]:
    """Start ``config``'s pipeline, answer ``warm`` once, then for each variant (its name labels the
    figures; ``""`` for none) and each concurrency in ``levels`` :func:`at_once`."""
    started = time.perf_counter()
    async with open_pipeline(config) as pipeline:
        health = await pipeline.health()
        startup = time.perf_counter() - started
        assert all(stage["alive"] for stage in health["stages"].values()), health
        await one_request(pipeline, "warm", warm, time.perf_counter())
        by_level = {
            f"{level} {name}".strip(): await at_once(pipeline, level, name, inputs, stage_pids(health))
            for name, inputs in variants.items()
            for level in levels
        }
    return {"startup_to_healthy_s": startup, "concurrency": by_level}


def run_sizes(
    args: argparse.Namespace,
    results: dict[str, Any],
    write_checkpoint: Callable[..., Path],
    run_generate: Callable[[Path, int, int, int, str, str], dict[str, Any]],
    pipeline_config: Callable[[Path, int, str, str, list[str]], PipelineConfig],
    variants: dict[str, Inputs],
    warm: dict[str, Any],
) -> None:
    """For each of ``args.sizes``: a random checkpoint (``write_checkpoint(dir, size=...)``), then
    ``run_generate(dir, count, tokens, frames, device, dtype)`` and :func:`run_pipeline` on
    ``pipeline_config(dir, frames, device, dtype, overrides)`` (``--set``'s), into ``results["sizes"]``."""
    count = max(3, max(args.concurrency))
    with tempfile.TemporaryDirectory(prefix="omni-bench-") as tmp:
        for size in args.sizes:
            model_dir = write_checkpoint(Path(tmp) / f"{size}-omni", size=size)
            generate = run_generate(model_dir, count, args.tokens, args.frames, args.device, args.dtype)
            config = pipeline_config(model_dir, args.frames, args.device, args.dtype, args.set)
            served = trio.run(run_pipeline, config, args.concurrency, variants, warm)
            results["sizes"][size] = {"generate": generate, "pipeline": served}


def table(results: dict[str, Any]) -> str:
    """One row per size for ``generate``, one per served concurrency (and variant) with its ratios to
    ``generate`` on the same prompts (its first ``c`` calls: the same prompts in the same order); ``*``
    marks a row whose answers are not as long as ``generate``'s."""
    head = f"{'size':8} {'who':22} {'TTFA s':>9} {'audio s/wall s':>15} {'audio s/req':>12}"
    lines = [f"{head} {'TTFA/gen':>9} {'rate/gen':>9} {'cores busy':>10}"]
    for size, figures in results["sizes"].items():
        gen = figures["generate"]
        lines.append(
            f"{size:8} {'generate (batch 1)':22} {gen['time_to_audio_s']:9.3f} {gen['audio_s_per_wall_s']:15.3f}"
            f" {gen['audio_s_per_request']:12.3f}"
        )
        for level, fig in figures["pipeline"]["concurrency"].items():
            n = fig["requests"]
            seconds, audio = gen["seconds"][:n], gen["audio_s"][:n]
            ttfa = fig["time_to_first_audio_s"] / statistics.mean(seconds)
            rate = fig["audio_s_per_wall_s"] / (sum(audio) / sum(seconds))
            mark = "" if all(abs(a - b) < 1e-9 for a, b in zip(fig["audio_s"], audio, strict=True)) else " *"
            who = f"pipeline x{level}"
            lines.append(
                f"{size:8} {who:22} {fig['time_to_first_audio_s']:9.3f} {fig['audio_s_per_wall_s']:15.3f}"
                f" {fig['audio_s_per_request']:12.3f} {ttfa:9.2f} {rate:9.2f} {fig['cores_busy']:10.2f}{mark}"
            )
        lines.append(
            f"{size:8} start-up to healthy (one process per stage): {figures['pipeline']['startup_to_healthy_s']:.1f} s"
        )
    lines.append(f"targets: {TARGETS}; * = answers not as long as generate's for the same prompts")
    return "\n".join(lines)


def begin(args: argparse.Namespace) -> dict[str, Any]:
    """The results' head: the run's settings and the load average before it."""
    return {
        "note": (
            "taken on whatever machine ran it; on a loaded machine (load average above its cores) the figures "
            "are not evidence of anything: rerun on a quiet one"
        ),
        "device": args.device,
        "dtype": args.dtype,
        "tokens": args.tokens,
        "frames": args.frames,
        "overrides": args.set,
        "targets": TARGETS,
        "load_average_before": os.getloadavg(),
        "sizes": {},
    }


def finish(results: dict[str, Any], out: Path) -> None:
    """Add the load average after (and "loaded" to the note when it was above the cores), print, write."""
    before, after = results["load_average_before"], os.getloadavg()
    results["load_average_after"] = after
    results["cores"] = os.cpu_count()
    results["loaded"] = max(before[0], after[0]) > (os.cpu_count() or 1)
    if results["loaded"]:
        results["note"] = (
            f"this run was on a loaded machine (load average {before[0]:.1f} before, {after[0]:.1f} after, on "
            f"{os.cpu_count()} cores): its figures are not evidence of anything; rerun on a quiet machine"
        )
    print(table(results))
    print(f"load average before {before}, after {after} ({os.cpu_count()} cores)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
