"""What a user of the voice loop waits for with SmolLM2 answering: end of speech to first answer audio.

A client of ``python -m omnitrio serve`` (the default pipeline: Whisper, SmolLM2-135M-Instruct on
llama.cpp, Piper) streams a spoken question in real time (100 ms chunks) with server VAD at its
default settings, and measures from sending the chunk holding the question's last voiced sample to
receiving the first ``response.output_audio.delta`` of a response not heard before.  That span holds
the VAD's silence window (``silence_duration_ms``), ASR, the model's prefill and its first sentence, and the
synthesis of that sentence.  At 1 and 4 concurrent sessions (turns 0.6 s apart).  Also chat time to
first token over HTTP (streamed, text only).

Run: ``.venv/bin/python bench/voice_llm.py [--turns 3] [--sessions 1 4]``.  Figures go to
``bench/results/voice_llm.json``.  Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.realtime_turn import CHUNK, silence, start_server, stream_audio, summary, synthesize  # noqa: E402
from omnitrio.client import open_realtime  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Name a fruit that is yellow.",
    "What color is the sky?",
]
RESULTS = ROOT / "bench" / "results" / "voice_llm.json"


async def voice_session(url: str, clips: list[bytes], delay: float, latencies: list[float]) -> None:
    """Ask each question then wait 4 s in silence, in real time; record last voiced chunk → first audio."""
    await trio.sleep(delay)
    async with open_realtime(url) as rt:
        await rt.receive()
        pieces = [piece for clip in clips for piece in (silence(0.3), clip, silence(4.0))]
        ends, samples = [], 0
        for piece in pieces:
            samples += len(piece) // 2
            if piece in clips:
                ends.append((samples - 1) // CHUNK * 0.1)  # when the chunk with the last voiced sample goes
        start = trio.current_time()
        async with trio.open_nursery() as nursery:

            async def listen() -> None:
                waiting = [start + e for e in ends]
                answered: set[str] = set()  # responses whose first audio was seen
                while waiting:
                    event = await rt.receive()
                    if event["type"] != "response.output_audio.delta" or event.get("response_id") in answered:
                        continue
                    answered.add(event.get("response_id", ""))
                    if trio.current_time() > waiting[0]:
                        latencies.append(trio.current_time() - waiting.pop(0))

            nursery.start_soon(listen)
            end = await stream_audio(rt, b"".join(pieces), start)
            with trio.move_on_after(max(0.0, end - trio.current_time()) + 10):
                await trio.sleep_forever()
            nursery.cancel_scope.cancel()


async def chat_first_token(port: int, rounds: int) -> dict[str, float]:
    import openai

    api = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    times = []
    for i in range(rounds):
        started = time.perf_counter()
        stream = await api.chat.completions.create(
            model="omnitrio-speech", messages=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], stream=True
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                times.append(time.perf_counter() - started)
                break
        async for _ in stream:
            pass
    await api.close()
    return summary(times)


async def main(turns: int, session_counts: list[int]) -> dict[str, Any]:
    clips = synthesize(QUESTIONS)
    server, port = start_server([])
    url = f"ws://127.0.0.1:{port}/v1/realtime"
    results: dict[str, Any] = {"cpus": os.cpu_count(), "load_avg_before": round(os.getloadavg()[0], 2)}
    try:
        results["chat_first_token"] = await chat_first_token(port, 8)
        print("chat first token:", results["chat_first_token"], flush=True)
        for sessions in session_counts:
            latencies: list[float] = []
            async with trio.open_nursery() as nursery:
                for i in range(sessions):
                    session_clips = [clips[(i + t) % len(clips)] for t in range(turns)]
                    nursery.start_soon(voice_session, url, session_clips, 0.6 * i, latencies)
            results[f"sessions_{sessions}"] = summary(latencies)
            print(f"{sessions} session(s): {results[f'sessions_{sessions}']}", flush=True)
        results["load_avg_after"] = round(os.getloadavg()[0], 2)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(30)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=3, help="questions per session (default 3)")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 4], help="concurrent sessions to measure")
    args = parser.parse_args()
    figures = trio.run(main, args.turns, args.sessions)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
