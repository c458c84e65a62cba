"""Realtime clients nobody here wrote, unchanged, against ``python -m omnitrio serve`` (the default pipeline).

Each client library runs as a subprocess script (``toys/realtime_clients/NAME.py``, in its own venv from
:mod:`toys.realtime_clients.venvs`; the official ``openai`` SDK in the project's) through a text turn, a
spoken turn (speech from the server's own voice, fed through the client's audio input API in real
time) and a barge-in over a spoken answer, then the answer to what the barge-in said. The script
reports what it saw as JSON lines; these tests judge them. The server runs the "repeat" responder,
so an answer says back what it was asked. A client that raises or reports an error, or sees an
event type outside the GA protocol's union, fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.realtime_sdk_types import ga_event_types
from tests.test_realtime_conformance import Server, server  # noqa: F401  (the module's server fixture)
from toys.realtime_clients.drive import SAID, SCRIPTS, TEXT, run_client, turn, write_settings
from toys.speech_text import heard_as

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # a client venv is built on first use
GA_EVENTS = ga_event_types()
RATE = 24_000


@pytest.fixture(scope="module")
def settings(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    return write_settings(tmp_path_factory.mktemp("clients"), server.url)


@pytest.fixture(scope="module", params=list(SCRIPTS))
def seen(request: pytest.FixtureRequest, settings: Path) -> Iterator[list[dict[str, Any]]]:
    """What one client saw through the turns (run once per client)."""
    yield run_client(request.param, settings)


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
    assert heard_as(spoken["transcript"], SAID["spoken"])


def test_speaking_over_an_answer_cancels_it(seen: list[dict[str, Any]]) -> None:
    barge_in = turn(seen, "barge_in")
    assert barge_in["status"] == "cancelled"
    assert barge_in["reason"] in ("turn_detected", "client_cancelled")  # LiveKit cancels at speech_started itself
    assert barge_in.get("audio_deltas_after_speech_started", 0) == 0


def test_what_the_barge_in_said_is_answered(seen: list[dict[str, Any]]) -> None:
    follow_up = turn(seen, "follow_up")
    assert follow_up["status"] == "completed"
    assert heard_as(follow_up["transcript"], SAID["barge"])
