"""Turn a results document into the printed table, ``latest.md`` and the PNG chart.

A row names where its figure lives in each runtime's results; a figure that is missing
(benchmark skipped, failed, or not applicable) shows as ``–``.  Ratios say how many times
better omnitrio is than the peer on that row (>1 = omnitrio better), whatever the unit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from bench.measure import fmt, ratio

RUNTIMES = ("omnitrio-inline", "omnitrio-processes", "peer")


@attrs.frozen
class Row:
    label: str
    unit: str
    path: tuple[str, ...]
    higher_is_better: bool = False


ROWS = [
    Row("1-stage chain, c=1 p50", "ms", ("hop_latency", "chain1", "p50_ms")),
    Row("1-stage chain, c=1 p99", "ms", ("hop_latency", "chain1", "p99_ms")),
    Row("4-stage chain, c=1 p50", "ms", ("hop_latency", "chain4", "p50_ms")),
    Row("4-stage chain, c=1 p99", "ms", ("hop_latency", "chain4", "p99_ms")),
    Row("each extra stage, c=1 p50", "ms", ("hop_latency", "per_extra_hop_p50_ms")),
    Row("start-up, 1 stage", "s", ("hop_latency", "chain1", "start_s")),
    Row("start-up, 4 stages", "s", ("hop_latency", "chain4", "start_s")),
    Row("shutdown, 1 stage", "s", ("hop_latency", "chain1", "stop_s")),
    Row("shutdown, 4 stages", "s", ("hop_latency", "chain4", "stop_s")),
    Row("fan (seed exp. 1), c=1 p50", "ms", ("fan", "c1", "p50_ms")),
    Row("fan, c=1 p99", "ms", ("fan", "c1", "p99_ms")),
    Row("fan, 256 in flight", "req/s", ("fan", "tp256", "req_per_s"), True),
    Row("fan, 256 in flight, latency p99", "ms", ("fan", "tp256", "loaded_p99_ms")),
    Row("stream c=1, chunks/s", "chunks/s", ("streaming", "c1", "chunks_per_s"), True),
    Row("stream c=1, first chunk p50", "ms", ("streaming", "c1", "first_chunk_p50_ms")),
    Row("stream c=16, chunks/s (all)", "chunks/s", ("streaming", "c16", "chunks_per_s"), True),
    Row("stream c=16, first chunk p50", "ms", ("streaming", "c16", "first_chunk_p50_ms")),
    Row("stream c=16, first chunk p99", "ms", ("streaming", "c16", "first_chunk_p99_ms")),
    Row("tensor 1 MB across processes", "GB/s", ("tensor", "1MB", "GB_per_s"), True),
    Row("tensor 16 MB", "GB/s", ("tensor", "16MB", "GB_per_s"), True),
    Row("tensor 128 MB", "GB/s", ("tensor", "128MB", "GB_per_s"), True),
    Row("lone request, window 200 ms, wait-when-idle", "ms", ("batching", "wait200_idleTrue", "p50_ms")),
    Row("lone request, window 200 ms, no idle wait", "ms", ("batching", "wait200_idleFalse", "p50_ms")),
    Row("lone request, window 50 ms, wait-when-idle", "ms", ("batching", "wait50_idleTrue", "p50_ms")),
    Row("lone request, window 50 ms, no idle wait", "ms", ("batching", "wait50_idleFalse", "p50_ms")),
    Row("abort mid-stream, call → return p50 (*)", "ms", ("abort", "p50_ms")),
    Row("abort mid-stream, call → return p99 (*)", "ms", ("abort", "p99_ms")),
    Row("RSS growth per 10k req, parent", "MiB", ("fan", "rss", "growth_mib_per_10k", "parent")),
    Row("RSS growth per 10k req, largest stage", "MiB", ("fan", "rss", "max_stage_growth_mib_per_10k")),
]

FLOOR_ROWS = [
    ("zmq ipc round trip, 2 processes, blocking, p50", "ms", ("zmq_ipc_rtt", "p50_ms")),
    ("zmq ipc round trip, p99", "ms", ("zmq_ipc_rtt", "p99_ms")),
    ("trio ⇄ thread round trip, p50", "ms", ("trio_thread_rtt", "p50_ms")),
    ("trio ⇄ thread round trip, p99", "ms", ("trio_thread_rtt", "p99_ms")),
    ("memcpy 128 MB into a pre-faulted buffer", "GB/s", ("memcpy_128MB", "GB_per_s")),
    ("one request task (spawn, cancel scope, one message), 256 in flight", "µs", ("request_task", "us_per_request")),
    ("fan ceiling from request tasks alone (5 each, 2 cores)", "req/s", ("request_task", "fan_ceiling_req_per_s")),
    ("streaming floor (bench/stream_floor.py), talker → vocoder, c=1", "chunks/s", ("stream", "c1", "chunks_per_s")),
    ("streaming floor, c=1 first chunk p50", "ms", ("stream", "c1", "first_chunk", "p50_ms")),
    ("streaming floor, c=16 (no fairness)", "chunks/s", ("stream", "c16", "chunks_per_s")),
    ("streaming floor, c=16 first chunk p50 (no fairness)", "ms", ("stream", "c16", "first_chunk", "p50_ms")),
]


def lookup(doc: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return doc if isinstance(doc, (int, float)) else None


def table_rows(results: dict[str, Any]) -> list[list[str]]:
    """One list of cells per row: label, unit, inline, processes, peer, ratios."""
    rows = []
    for row in ROWS:
        values = [lookup(results.get(rt, {}), row.path) for rt in RUNTIMES]
        if all(v is None for v in values):
            continue
        peer = values[2]
        ratios = [ratio(v, peer, higher_is_better=row.higher_is_better) for v in values[:2]]
        rows.append([row.label, row.unit, *(fmt(v) for v in values), *(_times(r) for r in ratios)])
    return rows


def _times(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


HEADER = ["benchmark", "unit", "omnitrio inline", "omnitrio processes", "peer 0.1.9", "inline vs peer", "procs vs peer"]


def markdown(doc: dict[str, Any]) -> str:
    """The table the README includes, with how and where it was measured."""
    results = doc["results"]
    lines = [
        f"Measured {doc['started']} on {doc['machine']}, `python -m bench{' --quick' if doc['quick'] else ''}`.",
        f"Load average at start {doc['loadavg_start']}, at end {doc['loadavg_end']}: the machine is shared with "
        "other work, so figures move ±10–30 % between runs. Ratios are omnitrio's advantage over the peer "
        "(> 1 = omnitrio better; for times peer ÷ omnitrio, for rates omnitrio ÷ peer), measured in the same run. "
        "The peer is SGLang-Omni 0.1.9 running the seed's stage modules, one process per stage.",
        "",
        *load_lines(results),
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(results)]
    lines += ["", ABORT_NOTE]
    floor = results.get("floor", {})
    lines += ["", "Transport floor on the same machine, same run:", "", "| floor | unit | value |", "|---|---|---|"]
    lines += [f"| {label} | {unit} | {fmt(lookup(floor, path))} |" for label, unit, path in FLOOR_ROWS]
    notes = [f"- {rt}: {results[rt]['unavailable']}" for rt in RUNTIMES if "unavailable" in results.get(rt, {})]
    for rt in RUNTIMES:
        for name, body in results.get(rt, {}).items():
            if isinstance(body, dict) and ("error" in body or "skipped" in body):
                notes.append(f"- {rt} / {name}: {body.get('error') or body.get('skipped')}")
    if notes:
        lines += ["", "Not measured in this run:", "", *notes]
    return "\n".join(lines) + "\n"


ABORT_NOTE = (
    "(*) Not the same promise: omnitrio's `abort(rid, wait=True)` returns once every stage has released the "
    "request; the peer's `abort(rid)` returns after broadcasting (it has no acknowledgement)."
)


def load_lines(results: dict[str, Any]) -> list[str]:
    """The 1-minute load average seen by each runtime's benchmarks (the runs are sequential, the box shared)."""
    lines = []
    for rt in RUNTIMES:
        loads = [b["loadavg"][0] for b in results.get(rt, {}).values() if isinstance(b, dict) and "loadavg" in b]
        if loads:
            lines.append(f"- load (1 min) while measuring {rt}: {min(loads):g}–{max(loads):g}")
    return lines


def text_table(results: dict[str, Any]) -> str:
    rows = [HEADER, *table_rows(results)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    out = []
    for i, cells in enumerate(rows):
        out.append(
            "  ".join(c.ljust(w) if j < 2 else c.rjust(w) for j, (c, w) in enumerate(zip(cells, widths, strict=True)))
        )
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    floor = results.get("floor", {})
    out += ["", ABORT_NOTE, "", *load_lines(results), ""]
    out += [f"floor: {label}: {fmt(lookup(floor, path))} {unit}" for label, unit, path in FLOOR_ROWS]
    return "\n".join(out)


def chart(doc: dict[str, Any], path: Path) -> None:
    """Horizontal bars: omnitrio's advantage over the peer per row (log scale, 1 = parity)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = doc["results"]
    labels, inline, procs = [], [], []
    for row in ROWS:
        values = [lookup(results.get(rt, {}), row.path) for rt in RUNTIMES]
        r_inline = ratio(values[0], values[2], higher_is_better=row.higher_is_better)
        r_procs = ratio(values[1], values[2], higher_is_better=row.higher_is_better)
        if r_inline is None and r_procs is None:
            continue
        labels.append(row.label)
        inline.append(r_inline or 0.0)
        procs.append(r_procs or 0.0)
    fig, ax = plt.subplots(figsize=(10, 0.38 * max(len(labels), 4) + 1.5))
    ys = range(len(labels))
    height = 0.4
    ax.barh([y - height / 2 for y in ys], procs, height, label="omnitrio, one process per stage", color="#2b6cb0")
    ax.barh([y + height / 2 for y in ys], inline, height, label="omnitrio inline", color="#9ac1e8")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yticks(list(ys), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("× better than SGLang-Omni 0.1.9 (log scale; 1 = parity; 0 = not measured)")
    ax.set_title(f"omnitrio vs peer, same run ({doc['started']}, load {doc['loadavg_start'][0]})", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
