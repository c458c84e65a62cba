"""The first request of each kind after the server says ready, against the second: does start-up pay it?

For the default pipeline (configs/speech.toml as shipped) and tiny Qwen3-Omni (configs/qwen3-omni.toml on
a random tiny checkpoint, its talker greedy so that a request's answer does not depend on its turn), each
kind of request is sent twice, one after the other, to a server that has just answered ``/health`` — a
fresh server per kind, so no kind warms another (``--shared``: one
server for all kinds, in order).  Measured from sending to the first answer a user hears or reads:

* ``chat text``: a streamed chat answer, text only, to its first content delta;
* ``chat audio``: streamed with ``modalities`` text and audio, to its first audio delta;
* ``chat audio in`` / ``chat image in`` (Qwen3-Omni): the question as an audio part / with an image, to its
  first audio delta;
* ``speech`` (default pipeline): ``/v1/audio/speech`` streamed, to its first audio delta;
* ``transcription``: the whole answer;
* ``realtime``: a new session, a spoken turn committed by hand, ``response.create`` to the first
  ``response.output_audio.delta``.

Prints per pipeline and kind the first, the second and their ratio; writes ``bench/results/first_request.json``
with the load average before and after.  ``--quick`` (to see that it works): both pipelines, each with
``--shared``, realtime first, written to ``bench/results/first_request_quick.json``.  Not a
test: nothing is asserted.  Run: ``.venv/bin/python bench/first_request.py [--pipelines speech qwen3-omni]``.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import sys
import tempfile
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.startup import write_tiny_checkpoint  # noqa: E402
from omnitrio.client import OmnitrioClient, open_realtime  # noqa: E402
from toys.served import open_server  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "first_request.json"
QUESTION = "What is the capital of France?"
KINDS = {
    "speech": ("chat text", "chat audio", "speech", "transcription", "realtime"),
    "qwen3-omni": ("chat text", "chat audio", "chat audio in", "chat image in", "transcription", "realtime"),
}
RATE = 24_000


def spoken_question() -> np.ndarray:
    """The question said by the default voice, float samples at 24 kHz."""
    from schedulers.speech.audio import resample
    from schedulers.speech.tts import shared_synthesizer

    tts = shared_synthesizer("auto", threads=2, variation=0.0)
    return resample(tts.synthesize(QUESTION), tts.sample_rate, RATE)


def wav(samples: np.ndarray, rate: int = RATE) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype(np.int16).tobytes())
    return out.getvalue()


def png() -> str:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.arange(32 * 32 * 3, dtype=np.uint8).reshape(32, 32, 3)).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def wanted_delta(event: dict[str, Any], wanted: str) -> bool:
    """Whether an SSE event carries the first answer of the ``wanted`` modality."""
    if event.get("type") == "speech.audio.delta":
        return True
    for choice in event.get("choices", []):
        delta = choice.get("delta", {})
        if delta.get("audio", {}).get("data") if wanted == "audio" else delta.get("content"):
            return True
    return False


async def first_delta(events: Any, wanted: str, start: float) -> float:
    """Seconds from ``start`` to the first delta of ``wanted`` in the SSE ``events``, read to their end."""
    first = float("nan")
    async for event in events:
        if first != first and wanted_delta(event, wanted):
            first = time.perf_counter() - start
    return first


async def one(client: OmnitrioClient, url: str, kind: str, question: np.ndarray) -> float:
    """Seconds from sending one request of ``kind`` to its first answer (module docstring)."""
    audio = {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}}
    text = [{"role": "user", "content": QUESTION}]
    question_wav = base64.b64encode(wav(question)).decode()
    audio_in = [{"type": "input_audio", "input_audio": {"data": question_wav, "format": "wav"}}]
    image_in = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": png()}}]
    start = time.perf_counter()
    match kind:
        case "chat text":
            return await first_delta(client.chat_stream(text, max_tokens=16, modalities=["text"]), "text", start)
        case "chat audio":
            return await first_delta(client.chat_stream(text, max_tokens=16, **audio), "audio", start)
        case "chat audio in" | "chat image in":
            content = audio_in if kind == "chat audio in" else image_in
            events = client.chat_stream([{"role": "user", "content": content}], max_tokens=16, **audio)
            return await first_delta(events, "audio", start)
        case "speech":
            return await first_delta(client.speech_events(QUESTION), "audio", start)
        case "transcription":
            await client.transcribe(wav(question))
            return time.perf_counter() - start
        case _:
            return await realtime_turn(url, question)


async def realtime_turn(url: str, question: np.ndarray) -> float:
    """A new session; the question appended and committed by hand; ``response.create`` to the first audio."""
    pcm = (np.clip(question, -1, 1) * 32767).astype(np.int16).tobytes()
    async with open_realtime(url.replace("http://", "ws://") + "/v1/realtime") as rt:
        await rt.receive()  # session.created
        manual = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
        await rt.send({"type": "session.update", "session": manual})
        while (await rt.receive())["type"] != "session.updated":
            pass
        step = 2 * RATE // 10
        for i in range(0, len(pcm), step):
            await rt.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i : i + step]).decode()})
        await rt.send({"type": "input_audio_buffer.commit"})
        while (await rt.receive())["type"] != "input_audio_buffer.committed":
            pass
        start = time.perf_counter()
        await rt.send({"type": "response.create"})
        first = None
        while True:
            event = await rt.receive()
            if event["type"] == "response.output_audio.delta" and first is None:
                first = time.perf_counter() - start
            if event["type"] == "response.done":
                return first if first is not None else float("nan")


def serve_args(pipeline: str, model: Path | None) -> list[str]:
    if pipeline == "speech":
        return ["--config", str(ROOT / "configs" / "speech.toml")]
    # a greedy talker: the same request is the same work each time (a sampled one may speak fewer frames)
    greedy = ["--set", "talker.factory.do_sample=false"]
    return ["--config", str(ROOT / "configs" / "qwen3-omni.toml"), "--model", str(model), *greedy]


async def measure(pipeline: str, kinds: tuple[str, ...], shared: bool, model: Path | None, scratch: Path) -> Any:
    question = spoken_question()
    found: dict[str, dict[str, float]] = {}

    async def on_server(kinds: tuple[str, ...]) -> None:
        async with open_server(serve_args(pipeline, model), Path(tempfile.mkdtemp(dir=scratch))) as served:
            async with OmnitrioClient(served.url, timeout=300) as client:
                await client.health()
                for kind in kinds:
                    first = await one(client, served.url, kind, question)
                    second = await one(client, served.url, kind, question)
                    found[kind] = {"first_s": first, "second_s": second, "first_over_second": first / second}
                    print(f"{pipeline:10} {kind:14} first {first:7.3f} s  second {second:7.3f} s", flush=True)

    if shared:
        await on_server(kinds)
    else:
        for kind in kinds:
            await on_server((kind,))
    return found


async def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"load_avg_before": round(os.getloadavg()[0], 2), "shared": args.shared}
    with tempfile.TemporaryDirectory(prefix="bench-first-") as scratch_dir:
        scratch = Path(scratch_dir)
        model = write_tiny_checkpoint(scratch) if "qwen3-omni" in args.pipelines else None
        for pipeline in args.pipelines:
            results[pipeline] = await measure(pipeline, KINDS[pipeline], args.shared, model, scratch)
    results["load_avg_after"] = round(os.getloadavg()[0], 2)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipelines", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--shared", action="store_true", help="one server for all kinds of a pipeline")
    parser.add_argument("--quick", action="store_true", help="one server per pipeline, realtime first")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.shared = True
        if args.out == RESULTS:
            args.out = RESULTS.with_name("first_request_quick.json")
        for pipeline, kinds in KINDS.items():
            KINDS[pipeline] = ("realtime", *(kind for kind in kinds if kind != "realtime"))
    results = trio.run(run, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
