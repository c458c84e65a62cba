"""The graph pieces every family composes (schedulers.graph): routing by task, and the omni front's routes."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from omnitrio.contract import InvalidRequest, OmniRequest, StagePayload
from schedulers.engine.handoffs import ThinkerResult
from schedulers.graph import front, tasks
from schedulers.session import SESSION_METADATA_KEY


def payload(data: Any = None, inputs: Any = None) -> StagePayload:
    return StagePayload("r1", OmniRequest(inputs=inputs), data)


@pytest.mark.parametrize(
    ("inputs", "task"),
    [
        ("hello", "chat"),
        ({"task": "chat", "messages": []}, "chat"),
        ({"task": "speech", "input": "hi"}, "speech"),
        ({"task": "transcription"}, "transcription"),
        ({"task": "asr_session", "command": {}}, "asr_session"),
    ],
)
def test_the_task_is_what_the_inputs_name(inputs: Any, task: str) -> None:
    assert tasks.task_of(inputs) == task == tasks.task_of(inputs, strict=False)


@pytest.mark.parametrize("inputs", [{"task": "realtime"}, {"messages": []}, 42])
def test_an_unknown_task_is_an_error_or_a_chat_for_the_models_stages_to_judge(inputs: Any) -> None:
    with pytest.raises(ValueError, match=r"inputs need 'task' set to one of \['chat', 'speech'"):
        tasks.task_of(inputs)
    assert tasks.task_of(inputs, strict=False) == "chat"


@pytest.mark.parametrize(
    ("inputs", "spoken"),
    [
        ({"task": "speech", "input": "hi"}, True),
        ({"task": "chat", "modalities": ["text", "audio"]}, True),
        ({"task": "chat", "modalities": ["text"]}, False),
        ({"task": "chat"}, False),
        ("hello", False),
        ({"task": "transcription", "modalities": ["audio"]}, False),
    ],
)
def test_an_answer_is_spoken_for_speech_and_for_a_chat_that_asks_for_audio(inputs: Any, spoken: bool) -> None:
    assert tasks.wants_audio(inputs) is spoken


ROUTES = tasks.TaskRoutes(model="preprocess", text="decode", talker="talker", audio="code2wav")


@pytest.mark.parametrize(
    ("inputs", "first", "terminals"),
    [
        ("hello", "preprocess", ["decode"]),
        ({"task": "chat", "modalities": ["text", "audio"]}, "preprocess", ["decode", "code2wav"]),
        ({"task": "transcription"}, "asr", ["asr"]),
        ({"task": "asr_session", "command": {}}, "stream_asr", ["stream_asr"]),
    ],
)
def test_a_request_starts_at_its_tasks_stage_and_ends_where_its_answer_is_made(
    inputs: Any, first: str, terminals: list[str]
) -> None:
    assert ROUTES.route_ingress("r1", payload(inputs=inputs)) == first
    assert ROUTES.terminal_stages("r1", inputs) == terminals


def test_the_thinker_sends_a_spoken_answer_to_the_talker_and_every_answer_to_decode() -> None:
    said = ThinkerResult((5,), 3, "stop", want_audio=False)
    spoke = ThinkerResult((5,), 3, "stop", want_audio=True)
    assert ROUTES.route_thinker("r1", payload(said)) == ["decode"]
    assert ROUTES.route_thinker("r1", payload(spoke)) == ["decode", "talker"]
    with pytest.raises(ValueError, match="route_thinker: expected a payload holding a ThinkerResult, got dict"):
        ROUTES.route_thinker("r1", payload({"want_audio": True}))


def test_a_session_command_goes_where_the_session_stage_reads_it() -> None:
    command = {"type": "append", "audio": b"\x00\x00"}
    admitted = tasks.admit_session_command(payload(inputs={"task": "asr_session", "command": command}))
    assert admitted.request.metadata[SESSION_METADATA_KEY] is command
    chat = tasks.admit_session_command(payload(inputs={"task": "chat", "command": command}))
    assert SESSION_METADATA_KEY not in chat.request.metadata


def test_a_session_request_without_a_command_is_the_callers_error() -> None:
    with pytest.raises(InvalidRequest, match="needs 'command'") as caught:
        tasks.admit_session_command(payload(inputs={"task": "asr_session"}))
    assert caught.value.param == "command"


@attrs.frozen
class Handoff:
    encoders: tuple[str, ...]


@pytest.mark.parametrize(
    "encoders", [(), (front.AUDIO_ENCODER,), (front.IMAGE_ENCODER,), (front.AUDIO_ENCODER, front.IMAGE_ENCODER)]
)
def test_a_request_visits_only_the_encoders_it_needs_and_aggregate_waits_for_exactly_those(
    encoders: tuple[str, ...],
) -> None:
    assert front.route_preprocess("r1", payload(Handoff(encoders))) == [*encoders, front.AGGREGATE]
    for source in (front.PREPROCESS, *encoders):
        waited = front.wait_for_aggregate("r1", source, payload(Handoff(encoders)))
        assert waited == [front.PREPROCESS, *encoders]


def test_a_front_payload_without_encoders_is_named_in_the_error() -> None:
    with pytest.raises(ValueError, match=r"wait_for_aggregate \(from 'image_encoder'\): .* got dict"):
        front.wait_for_aggregate("r1", "image_encoder", payload({"encoders": ["audio_encoder"]}))
