"""The per-process event recorder: off by default, buffered JSON lines with monotonic times when on."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from omnitrio import events
from omnitrio.events import EventRecorder, combine_hooks, event_file, open_recorder, recorder_from_env


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_recording_is_off_without_the_env_var_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(events.EVENT_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert recorder_from_env("main") is None
    assert list(tmp_path.iterdir()) == []


def test_env_var_turns_recording_on_into_a_per_process_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(events.EVENT_DIR_ENV, str(tmp_path / "ev"))
    recorder = recorder_from_env("p_thinker")
    assert recorder is not None
    recorder.close()
    assert recorder.path == tmp_path / "ev" / f"events_p_thinker_{os.getpid()}.jsonl"
    assert recorder.path.exists()


def test_file_name_replaces_characters_unsafe_in_a_file_name(tmp_path: Path) -> None:
    assert event_file(tmp_path, "a/b c", 7) == tmp_path / "events_a_b_c_7.jsonl"


def test_empty_process_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="process name"):
        event_file(tmp_path, "")


def test_events_are_buffered_until_close(tmp_path: Path) -> None:
    recorder = open_recorder(tmp_path, "main")
    recorder.emit("r1", "thinker", "stage_dispatch")
    assert recorder.path is not None
    assert recorder.path.read_bytes() == b""
    recorder.close()
    assert [e["event"] for e in lines(recorder.path)] == ["stage_dispatch"]


def test_written_line_holds_time_name_request_stage_fields_and_process(tmp_path: Path) -> None:
    with open_recorder(tmp_path, "p1") as recorder:
        before = time.monotonic_ns()
        recorder.emit("r1", "thinker", "stage_hop_sent", to_stage="talker", transport="ipc")
        after = time.monotonic_ns()
    assert recorder.path is not None
    [line] = lines(recorder.path)
    assert before <= line.pop("t_ns") <= after
    assert line == {
        "event": "stage_hop_sent",
        "request_id": "r1",
        "stage": "thinker",
        "fields": {"to_stage": "talker", "transport": "ipc"},
        "process": "p1",
        "pid": os.getpid(),
    }


def test_times_are_monotonic_and_in_emit_order(tmp_path: Path) -> None:
    with open_recorder(tmp_path, "main") as recorder:
        for i in range(50):
            recorder.emit(f"r{i}", "s", "stage_dispatch")
    assert recorder.path is not None
    written = lines(recorder.path)
    assert [e["request_id"] for e in written] == [f"r{i}" for i in range(50)]
    times = [e["t_ns"] for e in written]
    assert times == sorted(times)


def test_a_full_buffer_is_written_without_waiting_for_close(tmp_path: Path) -> None:
    recorder = open_recorder(tmp_path, "main", max_buffered=3)
    for i in range(4):
        recorder.emit(f"r{i}", "s", "stage_dispatch")
    assert recorder.path is not None
    assert len(lines(recorder.path)) == 3
    recorder.close()
    assert len(lines(recorder.path)) == 4


def test_buffer_is_written_at_the_first_emit_after_the_flush_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [0]
    monkeypatch.setattr(events, "_clock", lambda: now[0])
    recorder = open_recorder(tmp_path, "main", flush_interval=1.0)
    recorder.emit("r1", "s", "stage_dispatch")
    now[0] = 999_000_000
    recorder.emit("r2", "s", "stage_dispatch")
    assert recorder.path is not None
    assert recorder.path.read_bytes() == b""
    now[0] = 1_000_000_000
    recorder.emit("r3", "s", "stage_dispatch")
    assert [e["request_id"] for e in lines(recorder.path)] == ["r1", "r2", "r3"]
    recorder.close()


def test_field_values_json_cannot_hold_are_written_as_text(tmp_path: Path) -> None:
    with open_recorder(tmp_path, "main") as recorder:
        recorder.emit("r1", "s", "stage_failed", error=ValueError("bad"))
    assert recorder.path is not None
    assert lines(recorder.path)[0]["fields"] == {"error": "bad"}


def test_emits_after_close_are_dropped(tmp_path: Path) -> None:
    recorder = open_recorder(tmp_path, "main")
    recorder.close()
    recorder.emit("r1", "s", "stage_dispatch")
    recorder.close()
    assert recorder.path is not None
    assert recorder.path.read_bytes() == b""


def test_in_memory_recorder_keeps_flushed_events() -> None:
    recorder = EventRecorder.in_memory(process="test")
    recorder.emit("r1", "s", "stage_complete", terminal=True, next=[])
    recorder.flush()
    [event] = recorder.events
    assert (event.event, event.request_id, event.stage, event.fields) == (
        "stage_complete",
        "r1",
        "s",
        {"terminal": True, "next": []},
    )


def test_coordinator_hook_records_events_without_a_stage() -> None:
    recorder = EventRecorder.in_memory()
    recorder.coordinator_event("r1", "terminal_response", {"from_stage": "talker"})
    recorder.flush()
    [event] = recorder.events
    assert (event.stage, event.event, event.fields) == (None, "terminal_response", {"from_stage": "talker"})


def test_combined_hooks_each_see_every_event_in_order() -> None:
    seen: list[tuple[str, str, str]] = []
    hook = combine_hooks(
        lambda rid, name, fields: seen.append(("a", rid, name)),
        None,
        lambda rid, name, fields: seen.append(("b", rid, name)),
    )
    assert hook is not None
    hook("r1", "request_submitted", {})
    assert seen == [("a", "r1", "request_submitted"), ("b", "r1", "request_submitted")]


def test_combining_no_hooks_gives_none() -> None:
    assert combine_hooks(None, None) is None


def test_bad_buffer_size_is_refused() -> None:
    with pytest.raises(ValueError, match="max_buffered"):
        EventRecorder(None, max_buffered=0)
