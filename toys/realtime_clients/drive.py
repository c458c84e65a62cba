"""Running a client script (``toys/realtime_clients/SCRIPT.py``) against a served pipeline, for tests and bench.

:func:`write_settings` synthesizes the turns' speech with the server's own voice
(``/v1/audio/speech``) and writes the run settings :mod:`common` reads; :func:`run_client` runs
one script with its venv's interpreter (built on first use, :mod:`.venvs`) and returns the JSON
lines it printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from toys.realtime_clients import venvs
from toys.venvs import clean_env

HERE = Path(__file__).resolve().parent
SCRIPTS = {"openai_sdk": None, "agents_runner": "agents", "pipecat_service": "pipecat", "livekit_session": "livekit"}
"""Each client script and its venv (:data:`.venvs.CLIENTS`; None: the project's own, which has ``openai``)."""
TEXT = "Please send the report before Friday."
SAID = {
    "spoken": "Turn left at the second traffic light.",
    "long": "The train to Boston leaves from platform seven. The library closes at nine.",
    "barge": "Stop, please stop.",
}
RATE = 24_000
RUN_TIMEOUT = 300  # seconds one script may run (its own turns time out sooner)


def voiced_span(pcm: bytes) -> tuple[float, float]:
    """Seconds from the start of ``pcm`` to its first and past its last voiced sample (above 1/20 of its peak)."""
    samples = np.abs(np.frombuffer(pcm, "<i2").astype(np.float32))
    loud = np.flatnonzero(samples > samples.max() / 20)
    return float(loud[0]) / RATE, float(loud[-1] + 1) / RATE


def write_settings(folder: Path, http_url: str, say: Callable[[str], bytes] | None = None) -> Path:
    """The run settings for a server at ``http_url``, the speech files beside them in ``folder``;
    ``say``: how a sentence becomes PCM16 24 kHz speech (default: the server's own voice)."""
    args: dict[str, Any] = {"ws_url": http_url.replace("http", "ws", 1) + "/v1/realtime", "http_url": http_url}
    args["text"] = TEXT
    args["model"] = httpx.get(f"{http_url}/voice.json", timeout=30).json()["model"]  # the name the server answers to
    for name, text in SAID.items():
        pcm = bytes(2 * RATE // 5) + (say(text) if say is not None else _server_says(http_url, text))
        (folder / f"{name}.pcm").write_bytes(pcm)
        start, end = voiced_span(pcm)
        args.update({name: str(folder / f"{name}.pcm"), f"{name}_start_s": start, f"{name}_end_s": end})
    path = folder / "settings.json"
    path.write_text(json.dumps(args))
    return path


def _server_says(http_url: str, text: str) -> bytes:
    body = {"model": "omnitrio-speech", "input": text, "voice": "default", "response_format": "pcm"}
    return httpx.post(f"{http_url}/v1/audio/speech", json=body, timeout=60).content


def run_client(script: str, settings: Path) -> list[dict[str, Any]]:
    """Run ``toys/realtime_clients/SCRIPT.py`` once; the JSON lines it printed (its stderr is shown on failure)."""
    venv = SCRIPTS[script]
    python, env = (sys.executable, None) if venv is None else (str(venvs.interpreter(venv)), clean_env())
    command = [python, str(HERE / f"{script}.py"), str(settings)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines and lines[-1]["kind"] == "end", f"{script} exited {done.returncode}: {done.stderr[-3000:]}"
    return lines


def turn(seen: list[dict[str, Any]], step: str) -> dict[str, Any]:
    """The ``step`` turn a client reported."""
    found = [line for line in seen if line["kind"] == "turn" and line["step"] == step]
    assert found, f"no {step} turn in {[line for line in seen if line['kind'] != 'event']}"
    return found[0]
