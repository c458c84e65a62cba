"""Time to first audio of the omni-tiny pipeline (configs/omni-tiny.toml) at 1 and 8 concurrent requests.

Each request is a chat turn asking for ``modalities: ["text", "audio"]`` (24 answer tokens); with
``--media`` it also carries 1 s of audio and a 32x32 PNG, so both encoders run.  Measured through the
Python API (``pipeline.stream``), from entering the stream to: the first text delta (TTFT), the first
audio chunk (TTFA) and the last result (end to end).  ``c`` requests start together; a round waits
for all of them; one warm-up round is not counted.  Two placements:

* ``inline``: every stage in this process (one trio loop, one scheduler thread per stage);
* ``processes``: one spawned OS process per stage (payloads and chunks cross ZMQ / shared memory).

Run: ``.venv/bin/python bench/omni_tiny.py [--rounds 5] [--concurrency 1 8] [--media]``.
Figures go to ``bench/results/omni_tiny.json``.  Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from omnitrio import StreamMessage, open_pipeline  # noqa: E402
from omnitrio.config import PipelineConfig  # noqa: E402
from omnitrio.config_loading import load  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "omni_tiny.json"


def media_parts() -> list[dict[str, Any]]:
    import base64
    import io

    import numpy as np
    from PIL import Image

    from omnitrio.serve.audio import encode_wav

    t = np.arange(16_000) / 16_000
    wav = encode_wav((0.3 * np.sin(2 * np.pi * 330 * t) * 32767).astype(np.int16).tobytes(), 16_000)
    png = io.BytesIO()
    Image.fromarray(np.arange(32 * 32 * 3, dtype=np.uint8).reshape(32, 32, 3)).save(png, format="PNG")
    return [
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}},
        {
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()},
        },
    ]


def inputs(media: list[dict[str, Any]]) -> dict[str, Any]:
    content = [{"type": "text", "text": "tell me something about the weather"}, *media]
    return {"task": "chat", "messages": [{"role": "user", "content": content}], "modalities": ["text", "audio"]}


async def one(pipeline: Any, rid: str, request: dict[str, Any], out: list[dict[str, float]]) -> None:
    start = time.perf_counter()
    first: dict[str, float] = {}
    async with pipeline.stream(rid, request) as messages:
        async for message in messages:
            if isinstance(message, StreamMessage) and message.modality not in first:
                first[str(message.modality)] = time.perf_counter() - start
    out.append({"ttft": first["text"], "ttfa": first["audio"], "e2e": time.perf_counter() - start})


def summary(samples: list[dict[str, float]]) -> dict[str, Any]:
    figures: dict[str, Any] = {"requests": len(samples)}
    for key in ("ttft", "ttfa", "e2e"):
        ms = sorted(s[key] * 1000 for s in samples)
        figures[key] = {
            "p50_ms": round(statistics.median(ms), 1),
            "p95_ms": round(ms[min(len(ms) - 1, int(0.95 * len(ms)))], 1),
            "mean_ms": round(statistics.fmean(ms), 1),
        }
    return figures


def placed(config: PipelineConfig, placement: str) -> tuple[PipelineConfig, bool]:
    if placement == "processes":
        for stage in config.stages:
            stage.process = stage.name
        return config, False
    return config, True


async def run_placement(placement: str, args: argparse.Namespace, media: list[dict[str, Any]]) -> dict[str, Any]:
    config, inline = placed(load(ROOT / "configs" / "omni-tiny.toml"), placement)
    started = time.perf_counter()
    figures: dict[str, Any] = {}
    async with open_pipeline(config, inline=inline) as pipeline:
        figures["startup_s"] = round(time.perf_counter() - started, 2)
        request = inputs(media)
        for c in args.concurrency:
            samples: list[dict[str, float]] = []
            for round_no in range(args.rounds + 1):
                got: list[dict[str, float]] = []
                async with trio.open_nursery() as nursery:
                    for i in range(c):
                        nursery.start_soon(one, pipeline, f"{placement}-c{c}-r{round_no}-{i}", request, got)
                if round_no:  # round 0 warms up
                    samples += got
            figures[f"c{c}"] = summary(samples)
            print(f"{placement:9} c={c}: {json.dumps(figures[f'c{c}'])}", flush=True)
    return figures


async def main(args: argparse.Namespace) -> dict[str, Any]:
    media = media_parts() if args.media else []
    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "load_avg_before": round(os.getloadavg()[0], 2),
        "media": args.media,
        "answer_tokens": 24,
        "rounds": args.rounds,
    }
    for placement in args.placements:
        results[placement] = await run_placement(placement, args, media)
    results["load_avg_after"] = round(os.getloadavg()[0], 2)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--placements", nargs="+", default=["inline", "processes"], choices=["inline", "processes"])
    parser.add_argument("--media", action="store_true", help="add 1 s of audio and an image to each request")
    figures = trio.run(main, parser.parse_args())
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
