"""Speech stage inputs and the repeat responder (no models needed)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from omnitrio.contract import IncomingMessage, OmniRequest, StagePayload
from schedulers.speech.requests import speech_request, transcription_request, user_text
from schedulers.speech.stages import create_responder_stage


def payload(inputs: Any, **request: Any) -> StagePayload:
    return StagePayload("r", OmniRequest(inputs=inputs, **request), {"raw_inputs": inputs})


def test_speech_request_reads_openai_speech_fields() -> None:
    request = speech_request(payload({"task": "speech", "input": "Hi.", "voice": "alloy", "speed": 1.5}))
    assert (request.text, request.voice, request.speed) == ("Hi.", "alloy", 1.5)


def test_speech_request_reads_upstream_text() -> None:
    assert speech_request(StagePayload("r", OmniRequest(), {"text": "Echo."})).text == "Echo."


def test_speech_request_without_text_names_what_it_needs() -> None:
    with pytest.raises(ValueError, match="'speech' task or"):
        speech_request(payload({"task": "transcription", "audio": []}))


def test_transcription_request_resamples_to_16k() -> None:
    request = transcription_request(payload({"audio": np.zeros(24_000, np.float32), "sample_rate": 24_000}))
    assert request.audio.size == 16_000 and request.language is None


def test_transcription_request_rejects_stereo_audio() -> None:
    with pytest.raises(ValueError, match="audio: expected mono"):
        transcription_request(payload({"audio": np.zeros((2, 5), np.float32)}))


def test_user_text_is_the_last_user_chat_message() -> None:
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "reply"},
        {"role": "user", "content": [{"type": "text", "text": "second"}, {"type": "input_audio"}]},
    ]
    assert user_text(payload({"task": "chat", "messages": messages, "modalities": ["text"]})) == "second"


def test_chat_without_user_message_is_rejected() -> None:
    with pytest.raises(ValueError, match="role 'user'"):
        user_text(payload({"task": "chat", "messages": [{"role": "system", "content": "x"}]}))


def test_repeat_responder_speaks_the_transcript_back() -> None:
    scheduler = create_responder_stage(mode="repeat")
    thread = threading.Thread(target=scheduler.start)
    thread.start()
    try:
        transcript = StagePayload("r1", OmniRequest(), {"text": " hello there ", "language": "en"})
        scheduler.inbox.put(IncomingMessage("r1", "new_request", transcript))
        result = scheduler.outbox.get(timeout=10)
    finally:
        scheduler.stop()
        thread.join(10)
    assert (result.type, result.data.data) == ("result", {"text": "hello there"})


def test_unknown_responder_mode_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown responder mode 'echo'"):
        create_responder_stage(mode="echo")  # type: ignore[arg-type]
