"""The voice page at ``/``, in a real browser (Debian's chromium under Playwright), talking to Qwen3-Omni on a
tiny checkpoint: the model hears the microphone's turn and speaks; speaking over its answer stops it.
Qwen2.5-Omni answers the spoken question too (over the WebSocket).

The microphone is a WAV of Piper's speech (:func:`toys.realtime_omni.spoken`). The pipeline has no ASR
stage, so the page asks for no input transcription (``/voice.json``'s ``transcribes``) and shows no error.
Both transports the page has, the WebSocket and WebRTC. What the tiny model says is random: answers are
judged by their audio, not their words.
"""

from __future__ import annotations

import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import playwright.sync_api as playwright_api
import pytest

pytest.importorskip("piper", reason="the microphone's speech comes from the speech extra's Piper voice")

from tests.test_voice_page import ANSWERED, assert_answer_played, start, stats, wait_for  # the cascade page's
from toys.browser import RATE, Server, chromium_page, ensure_chromium
from toys.realtime_omni import FAMILIES, spoken

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TURN = 90_000  # ms a turn may take on a loaded machine
TRANSPORTS = ["websocket", "webrtc"]
QUESTION = "What is the capital of France?"
INTERRUPTION = "Stop. Wait a moment please."


def serving(name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Family ``name`` on its tiny checkpoint, for the page (skipped where chromium cannot be had)."""
    reason = ensure_chromium()
    if reason is not None:
        pytest.skip(reason)
    family = FAMILIES[name]
    checkpoint = family.write_checkpoint(tmp_path_factory.mktemp("omni-page") / "tiny")
    with family.serve_for_clients(checkpoint) as running:
        yield running


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serving("qwen3-omni", tmp_path_factory)


@pytest.fixture(scope="module")
def qwen2_5_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serving("qwen2.5-omni", tmp_path_factory)


def microphone_wav(path: Path, parts: list[str | float]) -> Path:
    """A mono 24 kHz WAV of ``parts``: each string said by Piper, each number that many seconds of silence."""
    pcm = b"".join(
        spoken(part, silence_before=0.0) if isinstance(part, str) else bytes(2 * int(part * RATE)) for part in parts
    )
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(pcm)
    return path


@pytest.fixture(scope="module")
def microphones(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("microphone")
    return {
        "question": microphone_wav(folder / "question.wav", [0.5, QUESTION, 4.0]),
        # The question, then, while its answer plays, the interruption.
        "interruption": microphone_wav(folder / "interruption.wav", [0.5, QUESTION, 1.6, INTERRUPTION, 4.0]),
    }


@pytest.fixture(scope="module")
def playwright() -> Iterator[Any]:
    with playwright_api.sync_playwright() as running:
        yield running


def assert_a_spoken_question_is_answered(server: Server, microphone: Path, playwright: Any, transport: str) -> None:
    with chromium_page(playwright, microphone, server.url) as page:
        start(page, transport, key=None)
        wait_for(page, ANSWERED)
        seen = stats(page)
    assert seen["transport"] == transport and seen["errors"] == []
    assert_answer_played(seen, transport, 0)
    assert 0 < seen["latencies"][0]["ms"] < TURN


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_spoken_question_is_answered_with_speech(
    server: Server, microphones: dict[str, Path], playwright: Any, transport: str
) -> None:
    assert_a_spoken_question_is_answered(server, microphones["question"], playwright, transport)


def test_qwen2_5_omni_answers_a_spoken_question_with_speech(
    qwen2_5_server: Server, microphones: dict[str, Path], playwright: Any
) -> None:
    assert_a_spoken_question_is_answered(qwen2_5_server, microphones["question"], playwright, "websocket")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_speaking_over_the_answer_stops_it(
    server: Server, microphones: dict[str, Path], playwright: Any, transport: str
) -> None:
    with chromium_page(playwright, microphones["interruption"], server.url) as page:
        start(page, transport, key=None)
        wait_for(page, "Object.keys(s.truncated).length > 0 || (s.cut && s.cut.length > 0)")
        seen = stats(page)
    assert seen["errors"] == []
    assert "input_audio_buffer.speech_started" in seen["events"]
