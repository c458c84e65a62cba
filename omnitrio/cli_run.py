"""``python -m omnitrio run``: one request through a pipeline, each chunk printed as it streams.

Text chunks print as they come, other chunks as a summary (arrays by dtype and shape); the result
prints as JSON at the end. ``--audio-out FILE.wav`` writes the streamed (or returned) PCM audio.
Exit codes: 0 success, 1 the request failed or no audio came for ``--audio-out``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import wave
from pathlib import Path
from typing import Any

import trio

from omnitrio.config import PipelineConfig


def parse_input(text: str) -> Any:
    """``INPUT`` as given on the command line: JSON when it parses, else the string itself."""
    if text == "-":
        text = sys.stdin.read()
    try:
        return json.loads(text)
    except ValueError:
        return text


def run_one(config: PipelineConfig, args: argparse.Namespace) -> int:
    """Run ``args.input`` through ``config``'s pipeline, printing each chunk and the result; the exit code."""
    from omnitrio.errors import RequestError

    inputs = parse_input(args.input)
    try:
        result, wrote_audio = trio.run(_run_async, config, inputs, args)
    except RequestError as exc:
        print(f"omnitrio: request failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summarize(result), indent=2, default=str))
    if args.audio_out is not None and not wrote_audio:
        hint = ""
        if isinstance(inputs, str):
            hint = (
                "; a plain-string INPUT asks for text (a chat turn in the shipped pipelines): ask for audio with "
                f"{shlex.quote(json.dumps({'task': 'speech', 'input': inputs}))} or a chat with "
                '"modalities": ["text", "audio"]'
            )
        print(f"omnitrio: error: the pipeline sent no audio; {args.audio_out} was not written{hint}", file=sys.stderr)
        return 1
    return 0


async def _run_async(config: PipelineConfig, inputs: Any, args: argparse.Namespace) -> tuple[Any, bool]:
    """Stream one request, one printed line per chunk; the result, and whether audio was written."""
    from omnitrio.messages import CompleteMessage, StreamMessage
    from omnitrio.runner import open_pipeline

    audio = _AudioSink(args.audio_out)
    async with open_pipeline(config) as pipeline:
        async with pipeline.stream("cli-run", inputs, timeout=args.timeout) as messages:
            async for message in messages:
                match message:
                    case StreamMessage(chunk=str(text), from_stage=stage, modality=modality):
                        print(f"[{stage} {modality or 'text'}] {json.dumps(text)}", flush=True)
                    case StreamMessage(chunk=chunk, from_stage=stage, modality=modality):
                        audio.add(chunk)
                        print(f"[{stage} {modality or 'stream'}: {json.dumps(summarize(chunk), default=str)}]")
                    case CompleteMessage():
                        continue
        result = messages.result
    if not audio.written and isinstance(result, dict):
        audio.add(result.get("audio"))  # a pipeline that hands its audio over only in the result
    return result, audio.close()


def summarize(value: Any) -> Any:
    """JSON-friendly ``value``: arrays become ``"<int16 array of 5120 samples>"``."""
    match value:
        case dict():
            return {str(k): summarize(v) for k, v in value.items()}
        case list() | tuple():
            return [summarize(v) for v in value]
        case str() | int() | float() | bool() | None:
            return value
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"<{getattr(value, 'dtype', '?')} array of shape {tuple(shape)}>"
    return repr(value)


class _AudioSink:
    """Streamed ``{"pcm", "sample_rate"}`` chunks to a PCM16 WAV file (when a path was given)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._wav: wave.Wave_write | None = None

    @property
    def written(self) -> bool:
        return self._wav is not None

    def add(self, chunk: Any) -> None:
        if self.path is None or not isinstance(chunk, dict) or "pcm" not in chunk:
            return
        import numpy as np

        pcm = np.asarray(chunk["pcm"])
        if pcm.dtype.kind == "f":
            pcm = np.round(np.clip(pcm, -1.0, 1.0) * 32767.0)
        if self._wav is None:
            self._wav = wave.open(str(self.path), "wb")  # closed in close()
            self._wav.setnchannels(1)
            self._wav.setsampwidth(2)
            self._wav.setframerate(int(chunk["sample_rate"]))
        self._wav.writeframes(pcm.astype("<i2").tobytes())

    def close(self) -> bool:
        """Finish the file; whether there was one."""
        if self._wav is None:
            return False
        self._wav.close()
        print(f"omnitrio: audio written to {self.path}", file=sys.stderr)
        return True
