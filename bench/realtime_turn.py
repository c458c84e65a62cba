"""Realtime turn latency of the default speech pipeline, as a client of ``python -m omnitrio serve`` sees it.

Turn latency, the wait a user feels: from the end of the user's speech (the last voiced sample of
the synthesized utterance: the last one above 1/20 of its peak) to receiving the first
``response.output_audio.delta`` of the answer. The client streams its microphone in real time as a
microphone does: each chunk (``--chunk-ms``, 20 by default, as WebRTC and phone gateways send) goes
when its last sample has been "recorded", so the end of speech happens at a known moment of the
client's clock. Also reported: ``input_audio_buffer.speech_stopped`` to that first audio (the
part after the turn was declared over). Each turn detection is measured (``server_vad`` with
OpenAI's default 500 ms of silence, ``semantic_vad`` at ``auto`` and ``high`` eagerness; on request
``server_vad_300ms``, a client's shorter silence) at 1 and at
4 concurrent sessions (their turns start 0.6 s apart, like independent users); the server's own
per-decision cost of ``semantic_vad`` (transcript, turn model, total) comes from
its ``/metrics``. Barge-in:
while an answer streams, the client starts speaking; measured from sending the first speech chunk,
and from receiving ``speech_started``, to ``response.done`` (cancelled), alone and in as many
concurrent sessions as the turn figures (their p50 and max); plus ``response.cancel`` to
``response.done``. Audio deltas received after ``speech_started`` are counted (should be 0), and the
audio the client held unplayed at ``speech_started`` (received minus played in real time since the
first delta: at most the server's lead). The server's own figures come from its ``/metrics``:
interruption to the last audio byte sent and to every stage having let the request go, audio unplayed
at the interruption, time to first audio, real-time factor and underruns of the audio sent.

Where each turn's milliseconds went (VAD edge, speech_stopped, the answer request's transcript, first
phrase, first audio synthesized, first audio received) is printed and recorded per measurement
(``where_the_ms_went``, :mod:`bench.turn_phases`).

Run: ``.venv/bin/python bench/realtime_turn.py [--turns 4] [--sessions 1 4] [--detections server_vad semantic_auto]
[--set KEY=VALUE] [--no-barge-in] [--out PATH]``. The server runs in a subprocess (its own GIL), started as a user would
(``--set``: its config overrides; ``responder.factory.mode=repeat`` takes the language model's time out of
the figures). The load average (1 min) is recorded before and after each measurement. Figures go to
``bench/results/realtime_turn.json`` (or ``--out``).
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
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import numpy as np
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.turn_phases import TurnTimes, match_turns, phase_summary, request_timelines, vad_edge_ms  # noqa: E402
from omnitrio.client import RealtimeClient, open_realtime  # noqa: E402

RATE = 24_000
CHUNK = RATE // 10  # 100 ms: barge-in and cancel sends
DETECTIONS: dict[str, dict[str, Any] | None] = {
    "server_vad": None,  # the session's default: no session.update (see turn_session)
    "server_vad_300ms": {"type": "server_vad", "silence_duration_ms": 300},  # a client that asks for less silence
    "semantic_auto": {"type": "semantic_vad", "eagerness": "auto"},
    "semantic_high": {"type": "semantic_vad", "eagerness": "high"},
}
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


def last_voiced(pcm: bytes) -> int:
    """The sample just after the last one above 1/20 of the clip's peak: where its speech ends."""
    samples = np.abs(np.frombuffer(pcm, "<i2").astype(np.int32))
    return int(np.flatnonzero(samples > samples.max() // 20)[-1]) + 1


async def stream_like_a_microphone(rt: RealtimeClient, pcm: bytes, start: float, chunk: int) -> None:
    """Send ``pcm`` in chunks of ``chunk`` samples, each when its last sample has been recorded
    (sample ``n`` is recorded at ``start + n / RATE``)."""
    for offset in range(0, len(pcm), 2 * chunk):
        piece = pcm[offset : offset + 2 * chunk]
        await trio.sleep_until(start + (offset + len(piece)) / 2 / RATE)
        await rt.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(piece).decode()})


async def stream_audio(rt: RealtimeClient, pcm: bytes, start: float) -> float:
    """Send ``pcm`` in real time from ``start`` (trio clock); returns when the last chunk is due."""
    for i, offset in enumerate(range(0, len(pcm), 2 * CHUNK)):
        await trio.sleep_until(start + i * 0.1)
        await rt.send(
            {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[offset : offset + 2 * CHUNK]).decode()}
        )
    return start + len(pcm) / 2 / RATE


@attrs.define
class TurnFigures:
    """Per answered turn: end of speech, and speech_stopped, to the first answer audio (seconds)."""

    from_end_of_speech: list[float] = attrs.field(factory=list)
    from_speech_stopped: list[float] = attrs.field(factory=list)
    missed: int = 0  # turns whose answer had sent no audio when the next speech started
    times: list[TurnTimes] = attrs.field(factory=list)  # per answered turn, for bench.turn_phases


async def turn_session(
    url: str,
    clips: list[bytes],
    delay: float,
    detection: dict[str, Any] | None,
    chunk_ms: int,
    figures: TurnFigures,
    label: str = "",
) -> None:
    """Speak each clip then 3 s of silence, in real time; time each answer's first audio.

    ``detection`` None keeps the default (server VAD) without a ``session.update``.
    """
    await trio.sleep(delay)
    async with open_realtime(url) as rt:
        await rt.receive()
        if detection is not None:
            audio = {"input": {"turn_detection": detection}}
            await rt.send({"type": "session.update", "session": {"audio": audio}})
            while (await rt.receive())["type"] != "session.updated":
                pass
        timeline, ends = b"", []
        for clip in clips:
            timeline += silence(0.3)
            ends.append((len(timeline) + 2 * last_voiced(clip)) / 2 / RATE)
            timeline += clip + silence(3.0)
        start = trio.current_time() + 0.05
        ends = [start + end for end in ends]
        edge = [vad_edge_ms(clip, RATE, last_voiced(clip)) for clip in clips]
        edges = dict(zip(ends, edge, strict=True))
        monotonic = time.monotonic() - trio.current_time()  # trio's clock to the server's timeline clock
        async with trio.open_nursery() as nursery:
            answered = trio.Event()

            async def listen() -> None:
                stopped: float | None = None
                spoken: float | None = None
                count = 0
                while True:
                    event = await rt.receive()
                    now = trio.current_time()
                    match event["type"]:
                        case "input_audio_buffer.speech_started" if stopped is not None:
                            figures.missed += 1
                            stopped = None
                        case "input_audio_buffer.speech_stopped":
                            stopped = now
                            spoken = max((end for end in ends if end <= now), default=None)
                        case "response.output_audio.delta" if stopped is not None:
                            figures.from_speech_stopped.append(now - stopped)
                            if spoken is not None:
                                figures.from_end_of_speech.append(now - spoken)
                                times = (spoken + monotonic, stopped + monotonic, now + monotonic)
                                figures.times.append(TurnTimes(label, *times, vad_edge_ms=edges[spoken]))
                            stopped = None
                            count += 1
                            if count == len(clips):
                                answered.set()

            nursery.start_soon(listen)
            await stream_like_a_microphone(rt, timeline, start, RATE * chunk_ms // 1000)
            with trio.move_on_after(10):  # the last answer may still be on its way
                await answered.wait()
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


def decision_totals(port: int) -> dict[str, float]:
    """The server's ``semantic_vad`` decision histogram: sum and count per part, as counted so far."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    found = re.findall(r'^omnitrio_realtime_turn_decision_seconds_(sum|count)\{part="(\w+)"\} (\S+)$', text, re.M)
    return {f"{part}_{kind}": float(value) for kind, part, value in found}


def decision_means(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Mean ms per decision part between two :func:`decision_totals`."""
    figures: dict[str, Any] = {}
    for key in after:
        if key.endswith("_count"):
            part = key.removesuffix("_count")
            count = after[key] - before.get(key, 0.0)
            total = after[f"{part}_sum"] - before.get(f"{part}_sum", 0.0)
            figures[f"{part}_ms"] = round(1000 * total / count, 1) if count else None
            figures["decisions"] = int(count)
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


def start_server(
    settings: list[str], event_dir: Path | None = None, args: Sequence[str] = ()
) -> tuple[subprocess.Popen[str], int]:
    """The server as a user starts it (``args``: more of its command line, e.g. ``--config``), recording
    its timeline events into ``event_dir`` when given."""
    command = [sys.executable, "-m", "omnitrio", "serve", "--port", "0", *args, *(f"--set={s}" for s in settings)]
    env = {**os.environ, **({"OMNITRIO_EVENT_DIR": str(event_dir)} if event_dir is not None else {})}
    server = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True, env=env)
    assert server.stderr is not None
    for line in server.stderr:
        print(line, end="", file=sys.stderr)
        found = re.search(r"serving .* on http://127\.0\.0\.1:(\d+)", line)
        if found:
            return server, int(found.group(1))
    raise RuntimeError(f"the server exited with {server.wait()} before serving")


async def turns(
    url: str,
    port: int,
    clips: list[bytes],
    detection: dict[str, Any] | None,
    sessions: int,
    turns: int,
    chunk_ms: int,
    label: str,
    times: list[TurnTimes],
) -> dict[str, Any]:
    """One measurement: ``sessions`` concurrent sessions of ``turns`` turns each with ``detection``;
    each answered turn's times go to ``times`` under ``label``."""
    figures = TurnFigures(times=times)
    load_before = os.getloadavg()[0]
    decisions_before = await trio.to_thread.run_sync(decision_totals, port)
    async with trio.open_nursery() as nursery:
        for i in range(sessions):
            session_clips = [clips[(i + t) % len(clips)] for t in range(turns)]
            nursery.start_soon(turn_session, url, session_clips, 0.6 * i, detection, chunk_ms, figures, label)
    decisions = decision_means(decisions_before, await trio.to_thread.run_sync(decision_totals, port))
    return {
        "end_of_speech_to_first_audio": summary(figures.from_end_of_speech),
        "speech_stopped_to_first_audio": summary(figures.from_speech_stopped),
        "turns_sent": sessions * turns,
        "turns_unanswered_before_next_speech": figures.missed,
        "server_decision_mean": decisions,
        "load_avg_before": round(load_before, 2),
        "load_avg_after": round(os.getloadavg()[0], 2),
    }


async def main(
    turn_count: int, session_counts: list[int], detections: list[str], chunk_ms: int, settings: list[str], barge: bool
) -> dict[str, Any]:
    clips = synthesize(UTTERANCES)
    long_clip, interruption = synthesize([LONG, "Stop, please stop."])
    event_dir = Path(tempfile.mkdtemp(prefix="realtime_turn_events_"))
    server, port = start_server(settings, event_dir)
    times: list[TurnTimes] = []
    url = f"ws://127.0.0.1:{port}/v1/realtime"
    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "chunk_ms": chunk_ms,
        "settings": settings,
        "load_avg_before": os.getloadavg()[0],
    }
    try:
        for name in detections:
            for sessions in session_counts:
                label = f"{name}_sessions_{sessions}"
                figures = await turns(url, port, clips, DETECTIONS[name], sessions, turn_count, chunk_ms, label, times)
                results[label] = figures
                print(f"{name}, {sessions} session(s): {json.dumps(figures)}", flush=True)
        if barge:
            results["barge_in"] = await barge_in(url, long_clip, interruption)
        for sessions in session_counts:
            if sessions > 1 and barge:
                results[f"barge_in_{sessions}"] = await barge_ins(url, long_clip, interruption, sessions)
                print(f"barge-in, {sessions} sessions: {results[f'barge_in_{sessions}']}", flush=True)
        if barge:
            results["response_cancel_ms"] = round(await cancel_time(url, long_clip), 1)
        results["server"] = server_figures(port)
        results["load_avg_after"] = os.getloadavg()[0]
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(30)
    rows = match_turns(times, request_timelines(event_dir))  # the server flushed its events on exit
    results["turn_milestones_ms"] = rows
    for measured in {row["label"] for row in rows}:
        phases = phase_summary([row for row in rows if row["label"] == measured])
        results[measured]["where_the_ms_went"] = phases
        print(f"{measured}: where the ms went (p50, ms after the end of speech): {json.dumps(phases)}", flush=True)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=4, help="turns per session (default 4)")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 4], help="concurrent sessions to measure")
    parser.add_argument(
        "--detections",
        nargs="+",
        default=["server_vad", "semantic_auto", "semantic_high"],
        choices=list(DETECTIONS),
        help="turn detections to measure",
    )
    parser.add_argument("--chunk-ms", type=int, default=20, help="microphone chunk length in ms (default 20)")
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for the server, e.g. responder.factory.mode=repeat (the realtime path alone)",
    )
    parser.add_argument("--no-barge-in", action="store_true", help="measure turns only (no barge-in, no cancel)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"where the figures go (default {RESULTS})")
    args = parser.parse_args()
    figures = trio.run(
        main, args.turns, args.sessions, args.detections, args.chunk_ms, args.settings, not args.no_barge_in
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
