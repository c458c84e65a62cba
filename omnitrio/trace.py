"""Read events files and summarise them: per stage, per hop, per request; one request's timeline.

``python -m omnitrio trace FILE_OR_DIR... [--request RID]`` prints, as plain-text tables,
the p50 / p95 / max (milliseconds) of:

- each stage's span, ``stage_input_received`` (its first input) → ``stage_complete``, and
  its compute span, ``stage_dispatch`` → ``stage_complete``;
- each hop ``A -> B``, ``stage_hop_sent`` at A → the next ``stage_input_received`` at B
  from A for the same request; ``A -> B (first chunk)`` pairs
  ``stage_first_stream_chunk_sent`` with B's first ``kind=chunk`` input from A;
  ``submit -> S`` pairs ``request_submitted`` with the entry stage's ``kind=submit`` input;
- per request: end to end (``request_submitted`` → ``terminal_response``), time to first
  token and to first audio (→ the first ``first_stream_chunk`` of that modality).

Failed and aborted spans are left out.  Percentiles are nearest-rank: p95 of 1..100 ms is
95 ms.  Times from different files compare directly (every process stamps
``CLOCK_MONOTONIC``; see :mod:`omnitrio.events`).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs
import msgspec

import omnitrio.events as ev
from omnitrio.events import Event

_decoder = msgspec.json.Decoder(Event)
_TOKEN_MODALITIES = frozenset({"text", "tokens", "token"})


class TraceError(ValueError):
    """An events file is missing or holds a line that is not an event; the message names it."""


def event_files(paths: Iterable[str | Path]) -> list[Path]:
    """The files to read: each file given, and every ``events_*.jsonl`` in each directory given."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(path.glob(ev.FILE_PATTERN))
            if not found:
                raise TraceError(f"{path}: directory holds no {ev.FILE_PATTERN} files")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise TraceError(f"{path}: no such file or directory")
    return files


def load(paths: Iterable[str | Path]) -> list[Event]:
    """Every event in ``paths`` (files or directories), ordered by time."""
    loaded: list[Event] = []
    for path in event_files(paths):
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    loaded.append(_decoder.decode(line))
                except msgspec.DecodeError as exc:
                    raise TraceError(f"{path}:{lineno}: not an event line: {exc}") from None
    loaded.sort(key=lambda e: e.t_ns)
    return loaded


# -- summaries ---------------------------------------------------------------------------


def percentile(samples: Sequence[int], p: float) -> int:
    """Nearest-rank percentile of ``samples`` (which must not be empty)."""
    if not samples:
        raise ValueError("percentile of no samples")
    ordered = sorted(samples)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


@attrs.define
class Summary:
    """Span durations in nanoseconds, keyed by stage or hop label."""

    stages: dict[str, list[int]] = attrs.field(factory=lambda: defaultdict(list))
    compute: dict[str, list[int]] = attrs.field(factory=lambda: defaultdict(list))
    hops: dict[str, list[int]] = attrs.field(factory=lambda: defaultdict(list))
    end_to_end: list[int] = attrs.field(factory=list)
    first_token: list[int] = attrs.field(factory=list)
    first_audio: list[int] = attrs.field(factory=list)
    events: int = 0


def summarize(events: Sequence[Event]) -> Summary:
    """Pair the events of ``events`` (ordered by time) into spans; see the module docstring."""
    out = Summary(events=len(events))
    opened: dict[tuple[str | None, str], int] = {}
    dispatched: dict[tuple[str | None, str], int] = {}
    sent: dict[tuple[str | None, str, str, str], deque[int]] = defaultdict(deque)
    submitted: dict[str | None, int] = {}
    unsent_submit: dict[str | None, int] = {}
    firsts: dict[str | None, set[str]] = defaultdict(set)
    for e in events:
        rid, t, f = e.request_id, e.t_ns, e.fields
        if e.stage is not None:
            _stage_event(out, e, opened, dispatched, sent, unsent_submit)
            continue
        match e.event:
            case ev.REQUEST_SUBMITTED:
                submitted[rid] = unsent_submit[rid] = t
                firsts.pop(rid, None)
            case ev.FIRST_STREAM_CHUNK if rid in submitted:
                modality = f.get("modality")
                kind = "token" if modality in _TOKEN_MODALITIES else "audio" if modality == "audio" else None
                if kind is not None and kind not in firsts[rid]:
                    firsts[rid].add(kind)
                    (out.first_token if kind == "token" else out.first_audio).append(t - submitted[rid])
            case ev.TERMINAL_RESPONSE if rid in submitted:
                out.end_to_end.append(t - submitted.pop(rid))
            case ev.REQUEST_FAILED | ev.REQUEST_ABORTED:
                submitted.pop(rid, None)
            case _:
                continue
    return out


def _stage_event(
    out: Summary,
    e: Event,
    opened: dict[tuple[str | None, str], int],
    dispatched: dict[tuple[str | None, str], int],
    sent: dict[tuple[str | None, str, str, str], deque[int]],
    unsent_submit: dict[str | None, int],
) -> None:
    assert e.stage is not None
    rid, stage, t, f = e.request_id, e.stage, e.t_ns, e.fields
    key = (rid, stage)
    match e.event:
        case ev.STAGE_INPUT_RECEIVED:
            opened.setdefault(key, t)
            src, kind = str(f.get("from_stage")), f.get("kind")
            if kind == "submit":
                start = unsent_submit.pop(rid, None)
                if start is not None:
                    out.hops[f"submit -> {stage}"].append(t - start)
                return
            channel = "chunk" if kind == "chunk" else "payload"
            queue = sent.get((rid, src, stage, channel))
            if queue:
                label = f"{src} -> {stage}" + (" (first chunk)" if channel == "chunk" else "")
                out.hops[label].append(t - queue.popleft())
        case ev.STAGE_DISPATCH:
            dispatched.setdefault(key, t)
        case ev.STAGE_HOP_SENT:
            sent[(rid, stage, str(f.get("to_stage")), "payload")].append(t)
        case ev.STAGE_FIRST_STREAM_CHUNK_SENT:
            sent[(rid, stage, str(f.get("to")), "chunk")].append(t)
        case ev.STAGE_COMPLETE:
            start = opened.pop(key, None)
            if start is not None:
                out.stages[stage].append(t - start)
            start = dispatched.pop(key, None)
            if start is not None:
                out.compute[stage].append(t - start)
        case ev.STAGE_FAILED | ev.STAGE_ABORTED:
            opened.pop(key, None)
            dispatched.pop(key, None)
        case _:
            return


# -- printing ----------------------------------------------------------------------------


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def format_table(title: str, rows: Iterable[tuple[str, Sequence[int]]], width: int = 0) -> list[str]:
    """A titled table of n / p50 / p95 / max in ms; rows without samples are skipped.

    The label column is at least ``width`` wide, so that tables printed together line up.
    """
    kept = [(label, samples) for label, samples in rows if samples]
    if not kept:
        return []
    width = max(width, len(title), *(len(label) + 2 for label, _ in kept))
    lines = [f"{title:<{width}}  {'n':>6}  {'p50 ms':>10}  {'p95 ms':>10}  {'max ms':>10}"]
    for label, samples in kept:
        p50, p95 = _ms(percentile(samples, 50)), _ms(percentile(samples, 95))
        lines.append(f"  {label:<{width - 2}}  {len(samples):>6}  {p50:>10}  {p95:>10}  {_ms(max(samples)):>10}")
    return lines


def format_summary(summary: Summary) -> str:
    """The four tables (stages, stage compute, hops, requests) as text."""
    tables: list[tuple[str, list[tuple[str, list[int]]]]] = [
        ("stage: input received -> complete", sorted(summary.stages.items())),
        ("stage compute: dispatch -> complete", sorted(summary.compute.items())),
        ("hop: sent -> input received", sorted(summary.hops.items())),
        (
            "request: submitted -> ...",
            [
                ("end to end", summary.end_to_end),
                ("first token", summary.first_token),
                ("first audio", summary.first_audio),
            ],
        ),
    ]
    width = max(max(len(title) for title, _ in tables), *(len(label) + 2 for _, rows in tables for label, _ in rows))
    sections = [format_table(title, rows, width) for title, rows in tables]
    text = "\n\n".join("\n".join(lines) for lines in sections if lines)
    return text or f"no complete spans among {summary.events} events"


def timeline(events: Sequence[Event], request_id: str) -> list[tuple[int, Event]]:
    """``(offset ns from the request's first request_submitted, event)`` for one request, in time order.

    Without a ``request_submitted`` (files of stage processes only) offsets count from its first event.
    """
    mine = [e for e in events if e.request_id == request_id]
    if not mine:
        return []
    origin = next((e.t_ns for e in mine if e.event == ev.REQUEST_SUBMITTED), mine[0].t_ns)
    return [(e.t_ns - origin, e) for e in mine]


def format_timeline(request_id: str, entries: Sequence[tuple[int, Event]]) -> str:
    origin = "request_submitted" if any(e.event == ev.REQUEST_SUBMITTED for _, e in entries) else "its first event"
    lines = [f"request {request_id!r}: offsets in ms from {origin}"]
    for offset, e in entries:
        where = e.stage if e.stage is not None else "(coordinator)"
        fields = " ".join(f"{k}={v}" for k, v in e.fields.items())
        lines.append(f"  {_ms(offset):>10}  {where:<16} {e.event:<30} {fields}".rstrip())
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    """``trace FILE_OR_DIR... [--request RID]``; 0 on success, 1 for an unknown request, 2 for bad input."""
    parser = argparse.ArgumentParser(
        prog="python -m omnitrio trace",
        description="Summarise omnitrio events files: per-stage, per-hop and per-request p50/p95.",
    )
    parser.add_argument("paths", nargs="+", metavar="FILE_OR_DIR", help="events_*.jsonl files or directories")
    parser.add_argument("--request", metavar="RID", help="also print this request's timeline")
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    try:
        loaded = load(args.paths)
    except (TraceError, OSError) as exc:
        print(f"trace: {exc}", file=sys.stderr)
        return 2
    print(format_summary(summarize(loaded)))
    if args.request is None:
        return 0
    entries = timeline(loaded, args.request)
    if not entries:
        print(f"trace: no events for request {args.request!r}", file=sys.stderr)
        return 1
    print()
    print(format_timeline(args.request, entries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
