"""The printed tables of :mod:`bench.turn_taking`: per-decision costs, precision and recall per detector."""

from __future__ import annotations

from typing import Any


def report(figures: dict[str, Any]) -> None:
    print(f"utterances: {figures['utterances']}  voices: {', '.join(figures['voices'])}")
    decision = figures["per_decision_ms"]
    print(
        f"per decision ({decision['decisions']}): words p50 {decision['words_ms']['p50']} ms,"
        f" audio model p50 {decision['model_ms']['p50']} ms (p90 {decision['model_ms']['p90']}),"
        f" transcript ASR p50 {decision['asr_ms']['p50']} ms; both side by side p50 {decision['decision_ms']['p50']} ms"
        f" (p90 {decision['decision_ms']['p90']})"
    )
    print("complete-turn latency: end of speech -> decision (with compute; silence waited alone)")
    held_out = figures["held_out"]
    report_table("", figures["detectors"])
    report_table(f"held out ({', '.join(held_out['voices'])}): ", held_out["detectors"])
    outcomes = figures["false_interruptions"]
    print(
        f"false interruptions: backchannels resumed {outcomes['backchannels_resumed']},"
        f" real interruptions cancelled {outcomes['interruptions_cancelled']}"
    )
    for row in outcomes["wrong"]:
        print(f"  wrong: {row['voice']} said {row['said']!r}, heard {row['transcript']!r} -> {row['outcome']}")


def report_table(which: str, table: dict[str, Any]) -> None:
    for cut, rows in table.items():
        print(f"\n{which}complete turns against {cut!r} ones")
        print(
            f"{'detector':<29} {'precision':>9} {'recall':>7} {'false':>6} {'p50 ms':>8} {'p90 ms':>8} {'silence':>8}"
        )
        for name, row in rows.items():
            latency, silence = row["complete_turn_latency_ms"], row["complete_turn_silence_ms"]
            print(
                f"{name:<29} {row['precision']!s:>9} {row['recall']!s:>7} {row['false_ends']:>6}"
                f" {latency['p50']!s:>8} {latency['p90']!s:>8} {silence['p50']!s:>8}"
            )
