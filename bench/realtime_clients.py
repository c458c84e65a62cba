"""Realtime turn latency and barge-in as four client libraries see them, against ``python -m omnitrio serve``.

Each client (the official ``openai`` SDK, openai-agents' ``RealtimeRunner``, pipecat's
``OpenAIRealtimeLLMService``, livekit-plugins-openai's ``RealtimeModel.session()``) runs the test
suite's client script (``toys/realtime_clients/``, each library in its own venv, :mod:`toys.realtime_clients.venvs`)
``--runs`` times, one session at a time, with the session settings the library picks itself (the
Agents SDK and LiveKit ask for ``semantic_vad``; the others keep the server's ``server_vad``).
Figures, from each script's clock:

* end of speech (the last voiced sample, "recorded" by a microphone streaming in real time) to the
  first answer audio received, for a short turn (``spoken``, ~2 s of speech) and a long one
  (``long``, ~4 s);
* barge-in: from the first voiced sample of speech over the answer to ``response.done`` (cancelled).

The load average (1 min) is recorded before and after each client. Run: ``.venv/bin/python
bench/realtime_clients.py [--runs 3] [--clients openai_sdk agents_runner ...] [--set KEY=VALUE] [--out PATH]``
(``--set``: server config overrides; ``responder.factory.mode=repeat`` by default, which takes the
language model's time out of the figures). Figures go to ``bench/results/realtime_clients.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.realtime_turn import start_server, summary  # noqa: E402
from toys.realtime_clients import venvs  # noqa: E402
from toys.realtime_clients.drive import SCRIPTS, run_client, turn, write_settings  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "realtime_clients.json"


def measure(script: str, settings: Path, runs: int) -> dict[str, Any]:
    """``runs`` runs of one client script, one session at a time; its figures and the load around them."""
    short, long, barge_in, errors = [], [], [], []
    load_before = os.getloadavg()[0]
    for _ in range(runs):
        seen = run_client(script, settings)
        errors += [line["message"][:300] for line in seen if line["kind"] == "error"]
        short.append(turn(seen, "spoken")["first_audio_s"])
        over = turn(seen, "barge_in")
        long.append(over["first_audio_s"])
        if over["status"] == "cancelled" and "to_cancelled_s" in over:
            barge_in.append(over["to_cancelled_s"])
    return {
        "end_of_speech_to_first_audio_short_turn": summary(short),
        "end_of_speech_to_first_audio_long_turn": summary(long),
        "barge_in_speech_to_cancelled": summary(barge_in),
        "errors": errors,
        "load_avg_before": round(load_before, 2),
        "load_avg_after": round(os.getloadavg()[0], 2),
    }


def main(runs: int, scripts: list[str], settings: list[str], out: Path) -> dict[str, Any]:
    for venv in {venv for script in scripts if (venv := SCRIPTS[script]) is not None}:
        venvs.interpreter(venv)  # built before the server starts: its install is no part of the figures
    server, port = start_server(settings)
    results: dict[str, Any] = {"cpus": os.cpu_count(), "settings": settings, "runs": runs, "sessions": 1}
    try:
        with tempfile.TemporaryDirectory() as folder:
            run_settings = write_settings(Path(folder), f"http://127.0.0.1:{port}")
            for script in scripts:
                results[script] = measure(script, run_settings, runs)
                print(f"{script}: {json.dumps(results[script])}", flush=True)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(30)
    results["load"] = "the 1-minute load average before and after each client is recorded beside its figures"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clients", nargs="+", default=list(SCRIPTS), choices=list(SCRIPTS))
    parser.add_argument("--set", dest="settings", action="append", default=None, metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    main(args.runs, args.clients, args.settings or ["responder.factory.mode=repeat"], args.out)
