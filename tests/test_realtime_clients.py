"""Realtime clients nobody here wrote, unchanged, against ``python -m omnitrio serve`` (the default pipeline).

Each client library runs as a subprocess script (``tests/clients/NAME.py``, in its own venv from
:mod:`tests.clients.venvs`; the official ``openai`` SDK in the project's) through a text turn, a
spoken turn (speech from the server's own voice, fed through the client's audio input API in real
time) and a barge-in over a spoken answer, then the answer to what the barge-in said. The script
reports what it saw as JSON lines; these tests judge them. The server runs the "repeat" responder,
so an answer says back what it was asked. A client that raises or reports an error, or sees an
event type outside the GA protocol's union, fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.clients import venvs
from tests.realtime_sdk_types import ga_event_types
from tests.test_realtime_conformance import Server, server  # noqa: F401  (the module's server fixture)
from toys.speech_text import heard_as
from toys.venvs import clean_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # a client venv is built on first use
CLIENTS = Path(__file__).resolve().parent / "clients"
SCRIPTS = {"openai_sdk": None, "agents_runner": "agents", "pipecat_service": "pipecat", "livekit_session": "livekit"}
"""Each client script and its venv (:data:`tests.clients.venvs.CLIENTS`; None: the project's own)."""
TEXT = "Please send the report before Friday."
SPOKEN = "Turn left at the second traffic light."
LONG = "The train to Boston leaves from platform seven. The library closes at nine."
BARGE = "Stop, please stop."
RATE = 24_000
SILENCE_AFTER = {"spoken": 0.0, "long": 0.0, "barge": 0.0}
GA_EVENTS = ga_event_types()


def voiced_span(pcm: bytes) -> tuple[float, float]:
    """Seconds from the start of ``pcm`` to its first and past its last voiced sample (above 1/20 of its peak)."""
    samples = np.abs(np.frombuffer(pcm, "<i2").astype(np.float32))
    loud = np.flatnonzero(samples > samples.max() / 20)
    return float(loud[0]) / RATE, float(loud[-1] + 1) / RATE


@pytest.fixture(scope="module")
def settings(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """The clients' run settings (see ``tests/clients/common.py``), speech written beside them."""
    folder = tmp_path_factory.mktemp("clients")
    said = {"spoken": SPOKEN, "long": LONG, "barge": BARGE}
    args: dict[str, Any] = {"ws_url": server.ws_url, "http_url": server.url, "text": TEXT}
    for name, text in said.items():
        pcm = server.speech(text, SILENCE_AFTER[name])
        (folder / f"{name}.pcm").write_bytes(pcm)
        start, end = voiced_span(pcm)
        args.update({name: str(folder / f"{name}.pcm"), f"{name}_start_s": start, f"{name}_end_s": end})
    path = folder / "settings.json"
    path.write_text(json.dumps(args))
    return path


def run_client(script: str, settings: Path) -> list[dict[str, Any]]:
    """Run ``tests/clients/SCRIPT.py`` once; the JSON lines it printed (its stderr is shown on failure)."""
    venv = SCRIPTS[script]
    python, env = (sys.executable, None) if venv is None else (str(venvs.interpreter(venv)), clean_env())
    command = [python, str(CLIENTS / f"{script}.py"), str(settings)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines and lines[-1]["kind"] == "end", f"{script} exited {done.returncode}: {done.stderr[-3000:]}"
    return lines


@pytest.fixture(scope="module", params=list(SCRIPTS))
def seen(request: pytest.FixtureRequest, settings: Path) -> Iterator[list[dict[str, Any]]]:
    """What one client saw through the three turns (run once per client)."""
    yield run_client(request.param, settings)


def turn(seen: list[dict[str, Any]], step: str) -> dict[str, Any]:
    found = [line for line in seen if line["kind"] == "turn" and line["step"] == step]
    assert found, f"no {step} turn in {[line for line in seen if line['kind'] != 'event']}"
    return found[0]


def test_the_client_reports_no_error(seen: list[dict[str, Any]]) -> None:
    assert [line["message"] for line in seen if line["kind"] == "error"] == []


def test_the_client_sees_only_events_of_the_ga_protocol(seen: list[dict[str, Any]]) -> None:
    types = {line["type"] for line in seen if line["kind"] == "event"}
    assert types - GA_EVENTS == set()


def test_a_text_turn_is_answered_with_speech(seen: list[dict[str, Any]]) -> None:
    text = turn(seen, "text")
    assert text["status"] == "completed" and text["audio_bytes"] > RATE
    assert heard_as(text["transcript"], TEXT)


def test_a_spoken_turn_is_answered_with_speech(seen: list[dict[str, Any]]) -> None:
    spoken = turn(seen, "spoken")
    assert spoken["status"] == "completed" and spoken["audio_bytes"] > RATE
    assert heard_as(spoken["transcript"], SPOKEN)


def test_speaking_over_an_answer_cancels_it(seen: list[dict[str, Any]]) -> None:
    barge_in = turn(seen, "barge_in")
    assert barge_in["status"] == "cancelled"
    assert barge_in["reason"] in ("turn_detected", "client_cancelled")  # LiveKit cancels at speech_started itself
    assert barge_in.get("audio_deltas_after_speech_started", 0) == 0


def test_what_the_barge_in_said_is_answered(seen: list[dict[str, Any]]) -> None:
    follow_up = turn(seen, "follow_up")
    assert follow_up["status"] == "completed"
    assert heard_as(follow_up["transcript"], BARGE)
