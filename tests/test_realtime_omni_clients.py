"""Realtime clients, unchanged, talking to the omni models (speech-native) on tiny checkpoints: with Qwen3-Omni
the official ``openai`` SDK, openai-agents' ``RealtimeRunner``, pipecat's ``OpenAIRealtimeLLMService`` and
livekit-plugins-openai's realtime session; with Qwen2.5-Omni the official SDK.

Each client (``toys/realtime_clients/SCRIPT.py``, in its venv: :data:`toys.realtime_clients.drive.SCRIPTS`)
goes through a text turn, a spoken turn (Piper's speech fed through its audio input in real time), a
barge-in over a spoken answer and the answer to what the barge-in said (:mod:`toys.realtime_clients.common`);
these tests judge what it reported. What the tiny model says is random: each answer is judged by its
audio and status, not its words.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("piper", reason="the turns' speech comes from the speech extra's Piper voice")

from tests.realtime_sdk_types import ga_event_types
from toys.realtime_clients.drive import turn
from toys.realtime_omni import FAMILIES, client_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


CLIENTS = [
    *(("qwen3-omni", script) for script in ("openai_sdk", "agents_runner", "pipecat_service", "livekit_session")),
    ("qwen2.5-omni", "openai_sdk"),
]


@pytest.fixture(scope="module")
def checkpoints() -> dict[str, Path]:
    """Each family's tiny checkpoint, written the first time a client needs it."""
    return {}


@pytest.fixture(scope="module", params=CLIENTS, ids=["-".join(pair) for pair in CLIENTS])
def seen(
    request: pytest.FixtureRequest, checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    """What one client saw through the turns with one family (run once per pair)."""
    name, script = request.param
    family = FAMILIES[name]
    if name not in checkpoints:
        checkpoints[name] = family.write_checkpoint(tmp_path_factory.mktemp("omni-checkpoint") / "tiny")
    return client_run(script, family, checkpoints[name], tmp_path_factory.mktemp("omni-client"))


def test_the_client_reports_no_error(seen: list[dict[str, Any]]) -> None:
    assert [line["message"] for line in seen if line["kind"] == "error"] == []


def test_the_client_sees_only_events_of_the_ga_protocol(seen: list[dict[str, Any]]) -> None:
    assert {line["type"] for line in seen if line["kind"] == "event"} - ga_event_types() == set()


@pytest.mark.parametrize("step", ["text", "spoken", "follow_up"])
def test_each_turn_is_answered_with_speech(seen: list[dict[str, Any]], step: str) -> None:
    answer = turn(seen, step)
    assert answer["status"] == "completed" and answer["audio_bytes"] > 0


def test_speaking_over_an_answer_cancels_it(seen: list[dict[str, Any]]) -> None:
    barge_in = turn(seen, "barge_in")
    assert barge_in["status"] == "cancelled"
    assert barge_in["reason"] in ("turn_detected", "client_cancelled")  # LiveKit cancels at speech_started itself
    assert barge_in.get("audio_deltas_after_speech_started", 0) == 0
