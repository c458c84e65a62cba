"""bench.turn_phases: each turn is matched to its answer request's timeline, and its ms split into phases."""

from __future__ import annotations

from pathlib import Path

import msgspec

from bench.turn_phases import TurnTimes, match_turns, phase_summary, request_timelines
from omnitrio.events import Event


def write_events(path: Path, events: list[tuple[float, str, str, str | None, dict[str, str]]]) -> None:
    encoder = msgspec.json.Encoder()
    lines = [
        encoder.encode(Event(int(t * 1e9), name, rid, stage, fields, "main", 1))
        for t, name, rid, stage, fields in events
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")


def answer(rid: str, start: float) -> list[tuple[float, str, str, str | None, dict[str, str]]]:
    return [
        (start, "request_submitted", rid, None, {}),
        (start + 0.01, "stage_input_received", rid, "responder", {"kind": "payload"}),
        (start + 0.2, "stage_first_stream_chunk_sent", rid, "responder", {"to": "tts"}),
        (start + 0.5, "first_stream_chunk", rid, None, {"from_stage": "tts", "modality": "audio"}),
    ]


def test_a_turn_gets_the_timeline_of_the_answer_it_heard_not_one_dropped_before(tmp_path: Path) -> None:
    dropped = [*answer("rtresp-dropped", 10.2), (10.8, "request_aborted", "rtresp-dropped", None, {})]
    kept = [*answer("rtresp-kept", 10.3), (12.0, "request_aborted", "rtresp-kept", None, {})]  # the next turn cut it
    write_events(tmp_path / "events_main_1.jsonl", [*dropped, *kept, *answer("listen-x", 10.0)])
    timelines = request_timelines(tmp_path)
    assert sorted(timelines) == ["rtresp-dropped", "rtresp-kept"]  # answers only, each that made audio
    (row,) = match_turns([TurnTimes("server_vad_sessions_1", 10.0, 10.6, 10.9, vad_edge_ms=20.0)], timelines)
    assert row == {
        "label": "server_vad_sessions_1",
        "speech_stopped": 600.0,
        "first_audio": 900.0,
        "transcript_ready": 300.0,
        "responder_input": 310.0,
        "first_phrase": 500.0,
        "first_audio_synthesized": 800.0,
        "vad_edge": 20.0,
    }


def test_phases_are_the_gaps_between_milestones_in_the_order_the_turn_passed_them() -> None:
    rows = [
        {"label": "x", "transcript_ready": 300.0, "speech_stopped": 600.0, "first_phrase": 500.0, "first_audio": 900.0}
    ]
    phases = phase_summary(rows)["phases_ms_p50"]
    assert phases == {
        "end_of_speech->transcript_ready": {"p50": 300.0, "turns": 1},
        "transcript_ready->first_phrase": {"p50": 200.0, "turns": 1},
        "first_phrase->speech_stopped": {"p50": 100.0, "turns": 1},
        "speech_stopped->first_audio": {"p50": 300.0, "turns": 1},
    }
