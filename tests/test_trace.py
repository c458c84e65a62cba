"""`python -m omnitrio trace`: per-stage, per-hop and per-request percentiles, and one request's timeline."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from omnitrio.events import Event
from omnitrio.trace import load, main, percentile, summarize

MS = 1_000_000
N = 20


def write(path: Path, events: list[Event]) -> None:
    path.write_bytes(msgspec.json.Encoder().encode_lines(events))


def ev(t: int, name: str, rid: str, stage: str | None = None, **fields: Any) -> Event:
    return Event(t, name, rid, stage, fields)


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    """A thinker → talker pipeline over three process files with known latencies.

    Request i (0..19): submit hop 0.5 ms; thinker span (i+1) ms; thinker → talker hop
    (i+1)*0.1 ms; talker span 5 ms; first audio 1 ms into talker; result 0.2 ms after talker.
    Request "bad" fails at the thinker and must not count.
    """
    main_, thinker, talker = [], [], []
    for i in range(N):
        rid, s = f"r{i}", i * 1000 * MS
        t_in = s + MS // 2
        t_done = t_in + (i + 1) * MS
        talker_in = t_done + (i + 1) * MS // 10
        talker_done = talker_in + 5 * MS
        main_ += [
            ev(s, "request_submitted", rid),
            ev(talker_in + MS, "first_stream_chunk", rid, from_stage="talker", modality="audio"),
            ev(talker_done + MS // 5, "terminal_response", rid, from_stage="talker"),
        ]
        thinker += [
            ev(t_in, "stage_input_received", rid, "thinker", from_stage="@coordinator", kind="submit"),
            ev(t_in + MS // 10, "stage_dispatch", rid, "thinker"),
            ev(t_done, "stage_complete", rid, "thinker", terminal=False, next=["talker"]),
            ev(t_done, "stage_hop_sent", rid, "thinker", to_stage="talker", transport="ipc"),
        ]
        talker += [
            ev(talker_in, "stage_input_received", rid, "talker", from_stage="thinker", kind="payload"),
            ev(talker_done, "stage_complete", rid, "talker", terminal=True, next=[]),
        ]
    bad = 100_000 * MS
    main_ += [ev(bad, "request_submitted", "bad"), ev(bad + 9 * MS, "request_failed", "bad", stage="thinker")]
    thinker += [
        ev(bad + MS, "stage_input_received", "bad", "thinker", from_stage="@coordinator", kind="submit"),
        ev(bad + 9 * MS, "stage_failed", "bad", "thinker", error_type="ValueError"),
    ]
    write(tmp_path / "events_main_1.jsonl", main_)
    write(tmp_path / "events_p_thinker_2.jsonl", thinker)
    write(tmp_path / "events_p_talker_3.jsonl", talker)
    return tmp_path


def row(label: str, n: int, p50: str, p95: str, mx: str) -> re.Pattern[str]:
    return re.compile(rf"^\s+{re.escape(label)}\s+{n}\s+{p50}\s+{p95}\s+{mx}$", re.M)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_percentiles_are_nearest_rank() -> None:
    samples = list(range(100, 0, -1))
    assert (percentile(samples, 50), percentile(samples, 95), percentile(samples, 100)) == (50, 95, 100)


def test_stage_spans_print_p50_p95_max_of_input_to_complete(
    trace_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = run(capsys, str(trace_dir))
    assert rc == 0
    assert row("thinker", N, "10.000", "19.000", "20.000").search(out)
    assert row("talker", N, "5.000", "5.000", "5.000").search(out)


def test_stage_compute_span_starts_at_dispatch(trace_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, str(trace_dir))
    compute = out.split("stage compute")[1].split("\n\n")[0]
    assert row("thinker", N, "9.900", "18.900", "19.900").search(compute)


def test_hops_pair_sends_and_receives_across_process_files(trace_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, str(trace_dir))
    assert row("thinker -> talker", N, "1.000", "1.900", "2.000").search(out)
    assert row("submit -> thinker", N + 1, "0.500", "0.500", "1.000").search(out)


def test_request_rows_give_end_to_end_and_first_audio(trace_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, str(trace_dir))
    assert row("end to end", N, "16.700", "26.600", "27.700").search(out)
    assert row("first audio", N, "12.500", "22.400", "23.500").search(out)
    assert "first token" not in out


def test_first_stream_chunk_of_text_counts_as_first_token() -> None:
    events = [
        ev(0, "request_submitted", "r"),
        ev(3 * MS, "first_stream_chunk", "r", from_stage="thinker", modality="text"),
        ev(4 * MS, "first_stream_chunk", "r", from_stage="thinker", modality="text"),
    ]
    assert summarize(events).first_token == [3 * MS]


def test_files_can_be_named_one_by_one(trace_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, str(trace_dir / "events_p_thinker_2.jsonl"))
    assert row("thinker", N, "10.000", "19.000", "20.000").search(out)
    assert "talker" not in out


def test_request_timeline_is_offsets_from_submission(trace_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, str(trace_dir), "--request", "r1")
    assert rc == 0
    timeline = out.split("request 'r1'")[1].splitlines()[1:]
    assert [line.split()[:3] for line in timeline] == [
        ["0.000", "(coordinator)", "request_submitted"],
        ["0.500", "thinker", "stage_input_received"],
        ["0.600", "thinker", "stage_dispatch"],
        ["2.500", "thinker", "stage_complete"],
        ["2.500", "thinker", "stage_hop_sent"],
        ["2.700", "talker", "stage_input_received"],
        ["3.700", "(coordinator)", "first_stream_chunk"],
        ["7.700", "talker", "stage_complete"],
        ["7.900", "(coordinator)", "terminal_response"],
    ]
    assert "to_stage=talker transport=ipc" in timeline[4]


def test_unknown_request_is_reported(trace_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, str(trace_dir), "--request", "nope")
    assert rc == 1
    assert "no events for request 'nope'" in err


def test_directory_without_event_files_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, str(tmp_path))
    assert rc == 2
    assert str(tmp_path) in err and "events_*.jsonl" in err


def test_missing_file_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, str(tmp_path / "gone.jsonl"))
    assert rc == 2
    assert "gone.jsonl: no such file" in err


def test_a_line_that_is_not_an_event_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "events_x_1.jsonl"
    path.write_text('{"t_ns": 1, "event": "a", "request_id": "r"}\n{"oops": 1}\n')
    with pytest.raises(ValueError, match=r"events_x_1\.jsonl:2: not an event line"):
        load([path])


def test_no_spans_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "events_x_1.jsonl", [ev(0, "request_submitted", "r")])
    rc, out, _ = run(capsys, str(tmp_path))
    assert rc == 0
    assert "no complete spans among 1 events" in out
