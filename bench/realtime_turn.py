"""Realtime turn latency of the default speech pipeline, as a client of ``python -m omnitrio serve`` sees it.

Turn latency: from receiving ``input_audio_buffer.speech_stopped`` to receiving the first
``response.output_audio.delta`` of the answer, with server VAD (silence_duration_ms=500) and the
client streaming its microphone in real time (100 ms chunks: speech, then silence). Measured at 1
and at 8 concurrent sessions (their turns start 0.6 s apart, like independent users). Barge-in:
while an answer streams, the client starts speaking; measured from sending the first speech chunk,
and from receiving ``speech_started``, to ``response.done`` (cancelled), alone and in as many
concurrent sessions as the turn figures (their p50 and max); plus ``response.cancel`` to
``response.done``. Audio deltas received after ``speech_started`` are counted (should be 0), and the
audio the client held unplayed at ``speech_started`` (received minus played in real time since the
first delta: at most the server's lead). The server's own figures come from its ``/metrics``:
interruption to the last audio byte sent and to every stage having let the request go, audio unplayed
at the interruption, time to first audio, real-time factor and underruns of the audio sent.

Run: ``.venv/bin/python bench/realtime_turn.py [--turns 4] [--sessions 1 8] [--set KEY=VALUE]``. The
server runs in a subprocess (its own GIL), started as a user would (``--set``: its config overrides;
``responder.factory.mode=repeat`` takes the language model's time out of the figures). Figures go to
``bench/results/realtime_turn.json``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from omnitrio.client import RealtimeClient, open_realtime  # noqa: E402

RATE = 24_000
CHUNK = RATE // 10  # 100 ms
UTTERANCES = [
    "Turn left at the second traffic light.",
    "My phone battery is almost empty.",
    "The weather will be sunny and warm tomorrow.",
    "Please send the report before Friday.",
]
# Its answer must still be streaming when the interruption is heard: seven sentences, ~1 s of synthesis.
LONG = (
    "The train to Boston leaves from platform seven. The library closes at nine. We need chairs for the room."
    " Bring your own lunch on Friday. The meeting moves to room four. Call me when you land. See you soon."
)
RESULTS = ROOT / "bench" / "results" / "realtime_turn.json"


def synthesize(texts: list[str]) -> list[bytes]:
    from schedulers.speech.audio import float_to_pcm16, resample
    from schedulers.speech.tts import shared_synthesizer

    tts = shared_synthesizer()
    return [float_to_pcm16(resample(tts.synthesize(t), tts.sample_rate, RATE)).tobytes() for t in texts]


def silence(seconds: float) -> bytes:
    return bytes(2 * int(seconds * RATE))


async def stream_audio(rt: RealtimeClient, pcm: bytes, start: float) -> float:
    """Send ``pcm`` in real time from ``start`` (trio clock); returns when the last chunk is due."""
    for i, offset in enumerate(range(0, len(pcm), 2 * CHUNK)):
        await trio.sleep_until(start + i * 0.1)
        await rt.send(
            {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[offset : offset + 2 * CHUNK]).decode()}
        )
    return start + len(pcm) / 2 / RATE


async def turn_session(url: str, clips: list[bytes], delay: float, latencies: list[float], missed: list[int]) -> None:
    """Speak each clip then 3 s of silence, in real time; record speech_stopped → first audio.

    A turn whose answer has sent no audio when the next speech starts counts in ``missed``.
    """
    await trio.sleep(delay)
    async with open_realtime(url) as rt:
        await rt.receive()
        timeline = b"".join(silence(0.3) + clip + silence(3.0) for clip in clips)
        async with trio.open_nursery() as nursery:

            async def listen() -> None:
                stopped: float | None = None
                answered = 0
                while answered < len(clips):
                    event = await rt.receive()
                    match event["type"]:
                        case "input_audio_buffer.speech_started" if stopped is not None:
                            missed.append(1)
                            stopped = None
                        case "input_audio_buffer.speech_stopped":
                            stopped = trio.current_time()
                        case "response.output_audio.delta" if stopped is not None:
                            latencies.append(trio.current_time() - stopped)
                            stopped = None
                        case "response.done":
                            answered += 1

            nursery.start_soon(listen)
            end = await stream_audio(rt, timeline, trio.current_time())
            with trio.move_on_after(max(0.0, end - trio.current_time()) + 5):
                await trio.sleep_forever()
            nursery.cancel_scope.cancel()


async def barge_in(url: str, long_clip: bytes, interruption: bytes) -> dict[str, float]:
    """While an answer streams, speak (in real time); time until its ``response.done`` (cancelled).

    The turn to answer is sent at once with ``create_response: false`` and answered on
    ``response.create``, so the answer is long and still streaming when the interruption starts.
    """
    async with open_realtime(url) as rt:
        await rt.receive()
        vad = {"type": "server_vad", "create_response": False}
        await rt.send({"type": "session.update", "session": {"turn_detection": vad}})
        pcm = silence(0.3) + long_clip + silence(0.8)
        for offset in range(0, len(pcm), 2 * CHUNK):
            chunk = base64.b64encode(pcm[offset : offset + 2 * CHUNK]).decode()
            await rt.send({"type": "input_audio_buffer.append", "audio": chunk})
        while (await rt.receive())["type"] != "input_audio_buffer.committed":
            pass
        await rt.send({"type": "response.create"})
        while (event := await rt.receive())["type"] != "response.output_audio.delta":
            pass
        first_audio = trio.current_time()
        received = len(base64.b64decode(event["delta"]))
        result: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            sent = trio.current_time()
            nursery.start_soon(stream_audio, rt, interruption + silence(2.0), sent)
            late = 0
            started_at: float | None = None
            while True:
                event = await rt.receive()
                match event["type"]:
                    case "response.output_audio.delta" if started_at is not None:
                        late += 1
                    case "response.output_audio.delta":
                        received += len(base64.b64decode(event["delta"]))
                    case "input_audio_buffer.speech_started":
                        started_at = trio.current_time()
                        held = received / 2 / RATE - (started_at - first_audio)
                        result["client_held_unplayed_at_speech_started_s"] = round(held, 3)
                    case "response.done":
                        now = trio.current_time()
                        result["cancelled"] = event["response"]["status"] == "cancelled"
                        result["from_first_speech_chunk_ms"] = round(1000 * (now - sent), 1)
                        result["from_speech_started_ms"] = round(1000 * (now - (started_at or now)), 1)
                        result["audio_deltas_after_speech_started"] = late
                        break
            nursery.cancel_scope.cancel()
        return result


async def barge_ins(url: str, long_clip: bytes, interruption: bytes, sessions: int) -> dict[str, Any]:
    """:func:`barge_in` in ``sessions`` concurrent sessions (started 0.6 s apart): the spread of its figures."""
    runs: list[dict[str, float]] = []

    async def one(delay: float) -> None:
        await trio.sleep(delay)
        runs.append(await barge_in(url, long_clip, interruption))

    async with trio.open_nursery() as nursery:
        for i in range(sessions):
            nursery.start_soon(one, 0.6 * i)
    held = sorted(run["client_held_unplayed_at_speech_started_s"] for run in runs if "cancelled" in run)
    stop = sorted(run["from_speech_started_ms"] for run in runs if "cancelled" in run)
    return {
        "sessions": sessions,
        "cancelled": sum(bool(run.get("cancelled")) for run in runs),
        "client_held_unplayed_s": {"p50": round(statistics.median(held), 3), "max": held[-1]} if held else None,
        "speech_started_to_done_ms": {"p50": round(statistics.median(stop), 1), "max": stop[-1]} if stop else None,
        "audio_deltas_after_speech_started": sum(int(run.get("audio_deltas_after_speech_started", 0)) for run in runs),
    }


async def cancel_time(url: str, long_clip: bytes) -> float:
    """Manual turns: commit, response.create, response.cancel at the first audio; ms until response.done."""
    async with open_realtime(url) as rt:
        await rt.receive()
        await rt.send({"type": "session.update", "session": {"turn_detection": None}})
        await rt.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(long_clip).decode()})
        await rt.send({"type": "input_audio_buffer.commit"})
        await rt.send({"type": "response.create"})
        sent = 0.0
        while True:
            event = await rt.receive()
            if event["type"] == "response.output_audio.delta" and not sent:
                sent = trio.current_time()
                await rt.send({"type": "response.cancel"})
            if event["type"] == "response.done":
                return 1000 * (trio.current_time() - sent)


SERVER_FIGURES = {
    "interrupt_to_last_audio_sent_ms": "omnitrio_realtime_interrupt_to_last_audio_seconds",
    "interrupt_to_every_stage_released_ms": "omnitrio_realtime_interrupt_to_released_seconds",
    "unplayed_audio_at_interrupt_ms": "omnitrio_realtime_unplayed_audio_at_interrupt_seconds",
    "time_to_first_audio_ms": "omnitrio_realtime_time_to_first_audio_seconds",
}


def server_figures(port: int) -> dict[str, Any]:
    """Means of the server's realtime histograms over the run (``/metrics``), and its underruns.

    Empty for a server that does not export them (an older checkout measured as the baseline).
    """
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    values = {
        line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("omnitrio_realtime")
    }
    if not values:
        return {}
    figures: dict[str, Any] = {}
    for key, name in SERVER_FIGURES.items():
        count = values.get(f"{name}_count", 0.0)
        figures[key] = {"count": int(count), "mean": round(1000 * values[f"{name}_sum"] / count, 1) if count else None}
    count = values.get("omnitrio_realtime_audio_rtf_count", 0.0)
    figures["audio_rtf_mean"] = round(values["omnitrio_realtime_audio_rtf_sum"] / count, 3) if count else None
    figures["underruns"] = int(values.get("omnitrio_realtime_audio_underruns_total", 0))
    return figures


def summary(latencies: list[float]) -> dict[str, float]:
    ms = sorted(1000 * x for x in latencies)
    if not ms:
        return {"turns": 0}
    return {
        "turns": len(ms),
        "p50_ms": round(statistics.median(ms), 1),
        "p90_ms": round(ms[min(len(ms) - 1, int(0.9 * len(ms)))], 1),
        "max_ms": round(ms[-1], 1),
        "mean_ms": round(statistics.fmean(ms), 1),
    }


def start_server(settings: list[str]) -> tuple[subprocess.Popen[str], int]:
    command = [sys.executable, "-m", "omnitrio", "serve", "--port", "0", *(f"--set={s}" for s in settings)]
    server = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    assert server.stderr is not None
    for line in server.stderr:
        print(line, end="", file=sys.stderr)
        found = re.search(r"serving .* on http://127\.0\.0\.1:(\d+)", line)
        if found:
            return server, int(found.group(1))
    raise RuntimeError(f"the server exited with {server.wait()} before serving")


async def main(turns: int, session_counts: list[int], settings: list[str]) -> dict[str, Any]:
    clips = synthesize(UTTERANCES)
    long_clip, interruption = synthesize([LONG, "Stop, please stop."])
    server, port = start_server(settings)
    url = f"ws://127.0.0.1:{port}/v1/realtime"
    results: dict[str, Any] = {"cpus": os.cpu_count(), "load_avg_before": os.getloadavg()[0], "settings": settings}
    try:
        for sessions in session_counts:
            latencies: list[float] = []
            missed: list[int] = []
            async with trio.open_nursery() as nursery:
                for i in range(sessions):
                    session_clips = [clips[(i + t) % len(clips)] for t in range(turns)]
                    nursery.start_soon(turn_session, url, session_clips, 0.6 * i, latencies, missed)
            results[f"sessions_{sessions}"] = {**summary(latencies), "turns_unanswered_before_next_speech": len(missed)}
            print(f"{sessions} session(s): {results[f'sessions_{sessions}']}", flush=True)
        results["barge_in"] = await barge_in(url, long_clip, interruption)
        for sessions in session_counts:
            if sessions > 1:
                results[f"barge_in_{sessions}"] = await barge_ins(url, long_clip, interruption, sessions)
                print(f"barge-in, {sessions} sessions: {results[f'barge_in_{sessions}']}", flush=True)
        results["response_cancel_ms"] = round(await cancel_time(url, long_clip), 1)
        results["server"] = server_figures(port)
        results["load_avg_after"] = os.getloadavg()[0]
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(30)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=4, help="turns per session (default 4)")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 8], help="concurrent sessions to measure")
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for the server, e.g. responder.factory.mode=repeat (the realtime path alone)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"where the figures go (default {RESULTS})")
    args = parser.parse_args()
    figures = trio.run(main, args.turns, args.sessions, args.settings)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
