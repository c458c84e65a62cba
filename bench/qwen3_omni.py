"""Qwen3-Omni served (configs/qwen3-omni.toml, one process per stage) beside transformers' ``generate``.

For each checkpoint size (random weights, schedulers/qwen3_omni/tiny.py): ``generate(return_audio=True)``
runs the prompts one after another (batch 1; it is not streaming, so its time to first audio is its whole
time), then the pipeline answers ``c`` concurrent requests for each ``c`` of ``--concurrency``: time to
first audio (submit → first pcm chunk) and audio seconds produced per wall second.  Both greedy (thinker
and talker), same prompts (text, an audio clip, an image, in turn), same token caps, one torch thread per
process.  Also: the pipeline's start-up until every stage process answers health.

Run: ``.venv/bin/python bench/qwen3_omni.py [--sizes tiny medium] [--concurrency 1 4 8]`` (``--quick``:
tiny only, 1 and 4 requests, short answers).  Prints a table and writes ``bench/results/qwen3_omni.json``
with the load average before and after.  Not a test: nothing is asserted; the issue's targets are shown.
On a GPU: ``--device cuda --dtype bfloat16`` places every model stage there (serve's flags).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from omnitrio import StreamMessage, open_pipeline  # noqa: E402
from omnitrio.config import PipelineConfig  # noqa: E402
from omnitrio.config_loading import load  # noqa: E402
from schedulers.qwen3_omni.tiny import write_checkpoint  # noqa: E402
from toys.qwen3_omni_reference import (  # noqa: E402
    load_reference_model,
    processor_inputs,
    reference_processor,
    sample_messages,
)
from toys.qwen3_omni_requests import chat_inputs, on_pcm_grid  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "qwen3_omni.json"
CONFIG = ROOT / "configs" / "qwen3-omni.toml"
PROMPTS = ("text", "tone", "image")
RATE = 24_000
TARGETS = {"ttfa_at_1_vs_generate_max": 0.25, "audio_per_wall_at_8_vs_generate_min": 3.0}


def run_generate(model_dir: Path, count: int, tokens: int, frames: int, device: str, dtype: str) -> dict[str, Any]:
    """``count`` greedy ``generate(return_audio=True)`` calls in turn: seconds each, audio seconds each."""
    model = load_reference_model(model_dir).to(device, getattr(torch, dtype))
    processor = reference_processor(model_dir)
    eos = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    messages = {name: on_pcm_grid(m) for name, m in sample_messages().items()}

    def generate(name: str, tokens: int, frames: int) -> float:
        inputs = processor_inputs(processor, messages[name]).to(device)
        with torch.inference_mode():
            _, wav = model.generate(
                **inputs,
                speaker="ethan",
                return_audio=True,
                thinker_max_new_tokens=tokens,
                thinker_eos_token_id=eos,
                thinker_do_sample=False,
                talker_do_sample=False,
                talker_max_new_tokens=frames,
                talker_min_new_tokens=2,
            )
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return 0.0 if wav is None else wav.numel() / RATE

    generate("text", 2, 4)  # warm-up
    seconds, audio = [], []
    for i in range(count):
        start = time.perf_counter()
        audio.append(generate(PROMPTS[i % 3], tokens, frames))
        seconds.append(time.perf_counter() - start)
    return {
        "requests": count,
        "time_to_audio_s": statistics.mean(seconds),
        "audio_s_per_wall_s": sum(audio) / sum(seconds),
        "audio_s_per_request": statistics.mean(audio),
    }


def pipeline_config(model_dir: Path, frames: int, device: str, dtype: str) -> PipelineConfig:
    overrides = ["talker.factory.do_sample=false", f"talker.factory.max_new_tokens={frames}"]
    overrides += ["talker.factory.min_new_tokens=2"]  # as toys.qwen3_omni_reference passes generate
    return load(CONFIG, overrides, model=model_dir, device=device, dtype=dtype)


async def one_request(pipeline: Any, rid: str, inputs: dict[str, Any], start: float) -> tuple[float, float]:
    """(seconds to the first audio chunk, audio seconds) of one request."""
    first, samples = None, 0
    async with pipeline.stream(rid, inputs) as stream:
        async for message in stream:
            if isinstance(message, StreamMessage) and message.modality == "audio":
                first = first if first is not None else time.perf_counter() - start
                samples += len(message.chunk["pcm"])
    return (first if first is not None else float("nan")), samples / RATE


async def run_pipeline(config: PipelineConfig, levels: list[int], tokens: int) -> dict[str, Any]:
    messages = {name: on_pcm_grid(m) for name, m in sample_messages().items()}
    started = time.perf_counter()
    async with open_pipeline(config) as pipeline:
        health = await pipeline.health()
        startup = time.perf_counter() - started
        assert all(stage["alive"] for stage in health["stages"].values()), health
        await one_request(pipeline, "warm", chat_inputs(messages["text"], max_tokens=2), time.perf_counter())
        by_level: dict[str, Any] = {}
        for level in levels:
            answers: list[tuple[float, float]] = []
            begin = time.perf_counter()

            async def run(i: int, level: int = level, begin: float = begin, answers: Any = answers) -> None:
                inputs = chat_inputs(messages[PROMPTS[i % 3]], max_tokens=tokens)
                answers.append(await one_request(pipeline, f"c{level}-{i}", inputs, begin))

            async with trio.open_nursery() as nursery:
                for i in range(level):
                    nursery.start_soon(run, i)
            wall = time.perf_counter() - begin
            by_level[str(level)] = {
                "time_to_first_audio_s": statistics.mean(a[0] for a in answers),
                "audio_s_per_wall_s": sum(a[1] for a in answers) / wall,
                "wall_s": wall,
            }
    return {"startup_to_healthy_s": startup, "concurrency": by_level}


def table(results: dict[str, Any]) -> str:
    lines = [f"{'size':8} {'who':22} {'TTFA s':>9} {'audio s/wall s':>15} {'TTFA/gen':>9} {'rate/gen':>9}"]
    for size, figures in results["sizes"].items():
        gen = figures["generate"]
        lines.append(
            f"{size:8} {'generate (batch 1)':22} {gen['time_to_audio_s']:9.3f} {gen['audio_s_per_wall_s']:15.3f}"
        )
        for level, fig in figures["pipeline"]["concurrency"].items():
            ttfa = fig["time_to_first_audio_s"] / gen["time_to_audio_s"]
            rate = fig["audio_s_per_wall_s"] / gen["audio_s_per_wall_s"]
            who = f"pipeline x{level}"
            lines.append(
                f"{size:8} {who:22} {fig['time_to_first_audio_s']:9.3f} {fig['audio_s_per_wall_s']:15.3f}"
                f" {ttfa:9.2f} {rate:9.2f}"
            )
        lines.append(
            f"{size:8} start-up to healthy (one process per stage): {figures['pipeline']['startup_to_healthy_s']:.1f} s"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "medium"], choices=["tiny", "medium"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 8])
    parser.add_argument("--tokens", type=int, default=24, help="thinker tokens per answer (max_tokens)")
    parser.add_argument("--frames", type=int, default=96, help="talker tokens per answer at most")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--quick", action="store_true", help="tiny only, 1 and 4 requests, short answers")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.concurrency, args.tokens, args.frames = ["tiny"], [1, 4], 12, 32
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    results: dict[str, Any] = {
        "note": (
            "taken on whatever machine ran it; on a loaded machine (load average above its cores) the figures "
            "are not evidence of anything: rerun on a quiet one"
        ),
        "device": args.device,
        "dtype": args.dtype,
        "tokens": args.tokens,
        "frames": args.frames,
        "targets": TARGETS,
        "load_average_before": load_before,
        "sizes": {},
    }
    with tempfile.TemporaryDirectory(prefix="qwen3-omni-bench-") as tmp:
        for size in args.sizes:
            model_dir = write_checkpoint(Path(tmp) / f"{size}-omni", size=size)
            generate = run_generate(
                model_dir, max(3, max(args.concurrency)), args.tokens, args.frames, args.device, args.dtype
            )
            config = pipeline_config(model_dir, args.frames, args.device, args.dtype)
            served = trio.run(run_pipeline, config, args.concurrency, args.tokens)
            results["sizes"][size] = {"generate": generate, "pipeline": served}
    results["load_average_after"] = os.getloadavg()
    results["cores"] = os.cpu_count()
    results["loaded"] = max(load_before[0], results["load_average_after"][0]) > (os.cpu_count() or 1)
    if results["loaded"]:
        results["note"] = (
            f"this run was on a loaded machine (load average {load_before[0]:.1f} before, "
            f"{results['load_average_after'][0]:.1f} after, on {os.cpu_count()} cores): its figures are not "
            "evidence of anything; rerun on a quiet machine"
        )
    print(table(results))
    print(f"load average before {load_before}, after {results['load_average_after']} ({os.cpu_count()} cores)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
