"""Realtime turn latency with Qwen3-Omni (speech-native) beside the cascade, in one run.

End of speech → first answer audio, as a client of ``python -m omnitrio serve`` sees it: the client
streams each spoken turn in real time (20 ms chunks) with server VAD (the session default: OpenAI's
500 ms of silence), and times the first ``response.output_audio.delta`` of each answer from the last
voiced sample of its speech (:func:`bench.realtime_turn.turns`, the cascade bench's own measurement),
at 1 and 4 concurrent sessions, after one turn that warms the server up (not measured). Two servers,
one after the other:

* ``qwen3-omni``: ``--config configs/qwen3-omni.toml --model DIR`` on a medium random checkpoint
  (:func:`schedulers.qwen3_omni.tiny.write_checkpoint`, ``size="medium"``), the turn's audio heard by the
  thinker, the answer spoken by talker → code2wav; the thinker's answer and the talker's codes are
  capped (``--omni-set``) so a random model's endless answer does not load the machine between turns;
* ``cascade``: the default pipeline (Whisper → SmolLM2 → Piper; ``--cascade-set
  responder.factory.mode=repeat`` takes the language model out).

Run: ``.venv/bin/python bench/realtime_omni.py [--turns 3] [--sessions 1 4] [--omni-set K=V] [--cascade-set K=V]
[--out PATH]``. The load average (1 min) is recorded around each measurement; figures go to
``bench/results/realtime_omni.json`` (or ``--out``).
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

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.realtime_turn import UTTERANCES, start_server, synthesize, turns  # noqa: E402
from bench.turn_phases import TurnTimes  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "realtime_omni.json"
CONFIG = ROOT / "configs" / "qwen3-omni.toml"
OMNI_SETTINGS = ["thinker.factory.max_new_tokens=32", "talker.factory.max_new_tokens=64"]


async def measure(
    name: str, settings: list[str], args: list[str], clips: list[bytes], sessions: list[int], turn_count: int
) -> dict[str, Any]:
    """One server (``args`` and ``settings`` on its command line): each session count measured in turn."""
    server, port = start_server(settings, args=args)
    url = f"ws://127.0.0.1:{port}/v1/realtime"
    results: dict[str, Any] = {"settings": settings, "args": args}
    times: list[TurnTimes] = []
    try:
        await turns(
            url, port, clips[:1], None, 1, 1, 20, f"{name}_warm_up", []
        )  # first answers load lazily: not measured
        for count in sessions:
            label = f"{name}_sessions_{count}"
            results[f"sessions_{count}"] = await turns(url, port, clips, None, count, turn_count, 20, label, times)
            print(f"{name}, {count} session(s): {json.dumps(results[f'sessions_{count}'])}", flush=True)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(60)
    return results


async def main(
    turn_count: int, sessions: list[int], omni_settings: list[str], cascade_settings: list[str]
) -> dict[str, Any]:
    import torch

    from schedulers.qwen3_omni.tiny import write_checkpoint

    clips = synthesize(UTTERANCES)
    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "turns_per_session": turn_count,
        "load_avg_before": os.getloadavg()[0],
    }
    with tempfile.TemporaryDirectory(prefix="realtime_omni_") as folder:
        torch.set_num_threads(1)
        checkpoint = write_checkpoint(Path(folder) / "medium", size="medium")
        omni_args = ["--config", str(CONFIG), "--model", str(checkpoint)]
        results["qwen3_omni_medium"] = await measure(
            "qwen3_omni", omni_settings, omni_args, clips, sessions, turn_count
        )
    results["cascade"] = await measure("cascade", cascade_settings, [], clips, sessions, turn_count)
    results["load_avg_after"] = os.getloadavg()[0]
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=3, help="turns per session (default 3)")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 4], help="concurrent sessions to measure")
    parser.add_argument("--omni-set", action="append", default=None, metavar="KEY=VALUE", help="qwen3-omni override")
    parser.add_argument("--cascade-set", action="append", default=[], metavar="KEY=VALUE", help="cascade override")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"where the figures go (default {RESULTS})")
    args = parser.parse_args()
    omni = OMNI_SETTINGS if args.omni_set is None else args.omni_set
    figures = trio.run(main, args.turns, args.sessions, omni, args.cascade_set)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
