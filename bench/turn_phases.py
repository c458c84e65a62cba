"""Where a realtime turn's milliseconds went, for ``bench/realtime_turn.py``.

Per answered turn the bench records, on ``CLOCK_MONOTONIC`` (``time.monotonic()``, the clock of the
server's timeline events, :mod:`omnitrio.events`), the end of the user's speech, the
``speech_stopped`` it received and the first answer audio it received. The server runs with
``OMNITRIO_EVENT_DIR`` set, so each answer request (``rtresp-*``) leaves its timeline: submitted (the
session submits it once the turn's transcript is ready: ``transcript_ready``), the ``responder``'s
input received, its first chunk sent to ``tts`` (the first phrase: prefill and every token up to it;
the first token alone leaves no event), the first audio chunk out of ``tts`` (first audio
synthesized). A turn's request is the one not aborted by then whose first audio chunk came last
before the client's first audio (the server holds a speculative answer until the turn ends, so it
may be early; one dropped was aborted before; one heard may be aborted later, by the next turn).

The VAD edge is measured on the input itself: the server's VAD (its default settings, as the
detection runs it, the same resampling to 16 kHz) run over the clip, where it puts the end of
speech minus the last voiced sample.

Milestones are ms after the end of speech (negative: before it, a speculative answer); ``phases``
are the p50 of the gaps between consecutive milestones, in the order the answer passes them.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import attrs
import msgspec
import numpy as np

from omnitrio.events import FILE_PATTERN, Event

MILESTONES = (
    "transcript_ready",
    "responder_input",
    "first_phrase",
    "first_audio_synthesized",
    "speech_stopped",
    "first_audio",
)


@attrs.define
class TurnTimes:
    """One answered turn on the monotonic clock (seconds), and which measurement it belongs to."""

    label: str
    end: float
    stopped: float
    first_audio: float
    vad_edge_ms: float | None = None


def vad_edge_ms(pcm24k: bytes, rate: int, true_end_sample: int) -> float:
    """ms from the clip's last voiced sample to where the server's VAD (server_vad defaults) ends its speech."""
    from schedulers.speech.audio import ASR_SAMPLE_RATE, StreamResampler, pcm16_to_float
    from schedulers.speech.vad import VoiceActivityDetector

    resampler = StreamResampler(rate, ASR_SAMPLE_RATE)
    audio = resampler.push(pcm16_to_float(np.frombuffer(pcm24k + bytes(2 * rate), "<i2")))
    vad = VoiceActivityDetector()
    stops = [event for event in vad.feed(audio) if event.type == "speech_stopped"]
    if not stops:
        return float("nan")
    speech_end = stops[0].sample - vad.silence_samples
    return 1000 * (speech_end / ASR_SAMPLE_RATE - true_end_sample / rate)


def request_timelines(directory: Path) -> dict[str, dict[str, float]]:
    """Per answer request (``rtresp-*``) that made audio: its milestones on the monotonic clock
    (seconds), and ``aborted`` when it was."""
    decoder = msgspec.json.Decoder(Event)
    timelines: dict[str, dict[str, float]] = defaultdict(dict)
    for path in sorted(directory.glob(FILE_PATTERN)):
        for line in path.read_bytes().splitlines():
            event = decoder.decode(line)
            rid = event.request_id
            if rid is None or not rid.startswith("rtresp"):
                continue
            t = event.t_ns / 1e9
            found = timelines[rid]
            match (event.event, event.stage):
                case ("request_submitted", None):
                    found.setdefault("transcript_ready", t)
                case ("stage_input_received", "responder"):
                    found.setdefault("responder_input", t)
                case ("stage_first_stream_chunk_sent", "responder"):
                    found.setdefault("first_phrase", t)
                case ("first_stream_chunk", None) if event.fields.get("modality") == "audio":
                    found.setdefault("first_audio_synthesized", t)
                case ("request_aborted", None) | ("stage_aborted", _):
                    found.setdefault("aborted", t)
    return {rid: found for rid, found in timelines.items() if "first_audio_synthesized" in found}


def match_turns(turns: list[TurnTimes], timelines: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """Each turn's milestones (ms after its end of speech), its request matched as the module says."""
    unused = dict(timelines)
    matched = []
    for turn in sorted(turns, key=lambda t: t.first_audio):
        before = [
            (found["first_audio_synthesized"], rid)
            for rid, found in unused.items()
            if found["first_audio_synthesized"] <= turn.first_audio < found.get("aborted", math.inf)
        ]
        milestones = {"speech_stopped": turn.stopped, "first_audio": turn.first_audio}
        if before:
            found = unused.pop(max(before)[1])
            milestones.update({name: t for name, t in found.items() if name in MILESTONES})
        row = {name: round(1000 * (t - turn.end), 1) for name, t in milestones.items()}
        if turn.vad_edge_ms is not None:
            row["vad_edge"] = round(turn.vad_edge_ms, 1)
        matched.append({"label": turn.label, **row})
    return matched


def phase_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """p50 per milestone and per gap between consecutive milestones (ms), over one measurement's turns."""
    summary: dict[str, Any] = {"turns": len(rows)}
    edges = [row["vad_edge"] for row in rows if "vad_edge" in row]
    if edges:
        summary["vad_edge_ms_p50"] = round(statistics.median(edges), 1)
    for name in MILESTONES:
        values = [row[name] for row in rows if name in row]
        if values:
            summary[f"{name}_ms_p50"] = round(statistics.median(values), 1)
    gaps: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        present = sorted((row[name], name) for name in MILESTONES if name in row)
        previous = (0.0, "end_of_speech")
        for t, name in present:
            gaps[f"{previous[1]}->{name}"].append(t - previous[0])
            previous = (t, name)
    summary["phases_ms_p50"] = {
        gap: {"p50": round(statistics.median(v), 1), "turns": len(v)} for gap, v in sorted(gaps.items())
    }
    return summary
