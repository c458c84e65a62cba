"""Turn latency in the browser: end of speech → first played audio, as the voice page measures it.

The page at ``/`` of ``python -m omnitrio serve`` runs in Debian's chromium (Playwright), its
microphone a WAV of ``--turns`` spoken questions (the server's own voice) with silence between them.
For each turn the page records the time from the last loud microphone piece before the server said
``speech_stopped`` to the first answer audio that played: over the WebSocket, when its jitter buffer
started the answer; over WebRTC, when the answer's track first got loud. Figures per transport:
every turn, p50 and max, at one session; the load average (1 min) before and after each run.

Run: ``.venv/bin/python bench/browser_turn.py [--turns 5] [--transports websocket webrtc] [--set KEY=VALUE]
[--out PATH]``. ``responder.factory.mode=repeat`` is the default override (the language model's
time left out). Figures go to ``bench/results/browser_turn.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from toys.browser import Server, chromium_page, ensure_chromium, served, speech_wav  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "browser_turn.json"
QUESTIONS = [
    "What is the capital of France?",
    "Turn left at the second traffic light.",
    "The library closes at nine on weekdays.",
    "Can you remind me to call my sister tonight?",
    "We need more chairs for the conference room.",
]
GAP_S = 6.0  # silence after each question: room for its answer to play


def run_page(playwright: Any, server: Server, microphone: Path, transport: str, turns: int) -> list[int]:
    """The page's latency readout (ms) for each of ``turns`` spoken turns over ``transport``."""
    with chromium_page(playwright, microphone, server.url) as page:
        page.click("summary")
        page.select_option("#transport", transport)
        page.click("#talk")
        condition = f"window.voiceStats.latencies.length >= {turns} || window.voiceStats.state === 'FAILED'"
        page.wait_for_function(condition, timeout=int((GAP_S + 10) * turns * 1000) + 60_000)
        stats = page.evaluate("window.voiceStats")
    if stats["errors"]:
        raise RuntimeError(f"the page failed over {transport}: {stats['errors']}")
    return [entry["ms"] for entry in stats["latencies"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--transports", nargs="+", default=["websocket", "webrtc"])
    parser.add_argument("--set", dest="overrides", action="append", default=["responder.factory.mode=repeat"])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    reason = ensure_chromium()
    if reason is not None:
        sys.exit(f"browser_turn: {reason}")
    from playwright.sync_api import sync_playwright

    sets = [item for override in args.overrides for item in ("--set", override)]
    results: dict[str, Any] = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "turns": args.turns}
    results["overrides"] = args.overrides
    with served(sets) as server, sync_playwright() as playwright, tempfile.TemporaryDirectory() as folder:
        parts: list[str | float] = [0.5]
        for i in range(args.turns):
            parts += [QUESTIONS[i % len(QUESTIONS)], GAP_S]
        microphone = speech_wav(server, Path(folder) / "turns.wav", parts)
        for transport in args.transports:
            load_before = os.getloadavg()[0]
            latencies = run_page(playwright, server, microphone, transport, args.turns)
            figures = {
                "latencies_ms": latencies,
                "p50_ms": statistics.median(latencies),
                "max_ms": max(latencies),
                "sessions": 1,
                "load_avg_before": round(load_before, 2),
                "load_avg_after": round(os.getloadavg()[0], 2),
            }
            results[transport] = figures
            print(f"{transport}: end of speech -> first played audio p50 {figures['p50_ms']} ms {figures}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
