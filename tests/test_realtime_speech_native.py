"""Realtime sessions with Qwen3-Omni (``--config configs/qwen3-omni.toml --model DIR``) on a tiny checkpoint.

The model hears each committed turn's audio and speaks its answer: greedy (session ``temperature`` 0,
``talker.factory.do_sample=false``), the first turn's answer — its transcript and its audio samples —
is ``generate``'s on the same samples brought to 16 kHz as the server does, and the second turn's is
``generate``'s on the two-turn conversation through the checkpoint's chat template (system =
instructions, the user's audio, ``generate``'s own first answer as text, a text item, the next
audio): nothing the server said goes into a reference. The answer streams in the GA order, in PCM16
and G.711 (both compared with ``generate``'s waveform sample by sample); a text-only session skips the
talker; barge-in over server VAD cancels the answer, every stage and the coordinator let it go, and
the client truncates it; input transcription without an ASR stage (``serves`` without
``transcription``) is an error event.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soxr
import trio

pytest.importorskip("piper", reason="the test's speech comes from the speech extra's Piper voice")

from omnitrio.client import RealtimeClient, open_realtime
from omnitrio.serve.realtime.g711 import TELEPHONY_RATE, decode
from tests.pipelines import settled_server
from tests.qwen3_omni_tiny import tiny_qwen3_omni_checkpoint  # noqa: F401  (fixture tiny_qwen3_omni)
from tests.realtime_events import DELTAS, GA_AUDIO_RESPONSE, output_audio
from toys.browser import Server
from toys.qwen3_omni_reference import (
    ReferenceOutput,
    load_reference_model,
    reference_generate,
    reference_processor,
)
from toys.qwen3_omni_requests import pcm16, snr_db
from toys.realtime_omni import GREEDY, NO_ASR, TALKER_TOKENS, as_heard, serve_omni, spoken

pytestmark = pytest.mark.timeout(900)

TOKENS = 10
PLAYED_MS = 20  # where the client says it stopped playing the interrupted answer
INSTRUCTIONS = "You are a helpful voice assistant."
TYPED = "What is said?"
FIRST, SECOND = "What is the weather like today?", "Thank you, that is all."
GREEDY_SESSION = {"instructions": INSTRUCTIONS, "temperature": 0, "max_output_tokens": TOKENS}
MANUAL = {"audio": {"input": {"turn_detection": None}}}
ANSWER_S = 300  # seconds a turn may take: five processes on a loaded machine
# The realtime PCM16 is code2wav's, untouched: against generate's waveform it holds what the pipeline's
# audio holds (tests/test_qwen3_omni_pipeline.py: float rounding flips a rare sample by 1 LSB).
MIN_SNR_DB = 80.0
# G.711 µ-law keeps 4 bits of mantissa: about 38 dB whatever the level (tests/test_telephony.py holds
# 30 dB for a tone); a wrong rate, law or byte order gives under 10 dB.
MIN_G711_SNR_DB = 30.0
EDGE = 400  # 8 kHz samples at each end where the resamplers' filters differ (stateful stream, one shot)


@pytest.fixture(scope="module")
def checkpoint(tiny_qwen3_omni: Path) -> Path:
    return tiny_qwen3_omni


@pytest.fixture(scope="module")
def server(checkpoint: Path) -> Any:
    with serve_omni(checkpoint, (*GREEDY, NO_ASR)) as running:
        yield running


@pytest.fixture(scope="module")
def turns() -> dict[str, bytes]:
    return {"first": spoken(FIRST), "second": spoken(SECOND)}


@pytest.fixture(scope="module")
def references(checkpoint: Path, turns: dict[str, bytes]) -> dict[str, Any]:
    """``generate`` on the first turn, and on the conversation the second turn answers, in which the first
    turn's answer is ``generate``'s own (decoded as the server keeps an answer: its transcript)."""
    model, processor = load_reference_model(checkpoint), reference_processor(checkpoint)

    def decode_ids(ids: list[int]) -> str:
        return str(processor.tokenizer.decode(ids, skip_special_tokens=True))

    def generate(messages: list[dict[str, Any]]) -> ReferenceOutput:
        return reference_generate(
            model, processor, messages, max_new_tokens=TOKENS, talker_max_new_tokens=TALKER_TOKENS
        )

    system = {"role": "system", "content": INSTRUCTIONS}
    first = {"role": "user", "content": [{"type": "audio", "audio": as_heard(turns["first"])}]}
    second = {"role": "user", "content": [{"type": "audio", "audio": as_heard(turns["second"])}]}
    answer = generate([system, first])
    said = {"role": "assistant", "content": decode_ids(answer.token_ids)}
    typed = {"role": "user", "content": TYPED}
    return {"first": answer, "second": generate([system, first, said, typed, second]), "decode": decode_ids}


async def start(rt: RealtimeClient, **session: Any) -> None:
    await rt.receive()
    await rt.send({"type": "session.update", "session": {"type": "realtime", **session}})
    await rt.receive_until("session.updated")


async def commit(rt: RealtimeClient, pcm16: bytes) -> None:
    await rt.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16).decode()})
    await rt.send({"type": "input_audio_buffer.commit"})
    await rt.receive_until("conversation.item.done", timeout=ANSWER_S)


async def respond(rt: RealtimeClient) -> list[dict[str, Any]]:
    await rt.send({"type": "response.create"})
    return await rt.receive_until("response.done", timeout=ANSWER_S)


def transcript(events: list[dict[str, Any]]) -> str:
    return str(events[-1]["response"]["output"][0]["content"][0]["transcript"])


def two_turns(server: Server, turns: dict[str, bytes]) -> dict[str, Any]:
    """One session of two spoken turns, committed by hand (the first answered, a text item, the second):
    the answers' events, by turn."""

    async def session() -> dict[str, Any]:
        async with open_realtime(server.url.replace("http", "ws", 1) + "/v1/realtime") as rt:
            await start(rt, **GREEDY_SESSION, **MANUAL)
            await commit(rt, turns["first"])
            first = await respond(rt)
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": TYPED}]}
            await rt.send({"type": "conversation.item.create", "item": item})
            await rt.receive_until("conversation.item.done")
            await commit(rt, turns["second"])
            return {"first": first, "second": await respond(rt)}

    return trio.run(session)


@pytest.fixture(scope="module")
def answered(server: Server, turns: dict[str, bytes]) -> dict[str, Any]:
    return two_turns(server, turns)


def test_a_spoken_turn_is_answered_with_audio_and_its_transcript_in_the_ga_order(answered: dict[str, Any]) -> None:
    events = answered["first"]
    assert [e["type"] for e in events if e["type"] not in DELTAS] == GA_AUDIO_RESPONSE
    deltas = [e for e in events if e["type"] in DELTAS]
    assert {e["type"] for e in deltas} == {"response.output_audio.delta", "response.output_audio_transcript.delta"}
    said = "".join(e["delta"] for e in deltas if e["type"] == "response.output_audio_transcript.delta")
    assert events[-1]["response"]["status"] == "completed" and said == transcript(events)


def test_the_first_answer_is_generates_on_the_same_audio(answered: dict[str, Any], references: Any) -> None:
    expected: ReferenceOutput = references["first"]
    assert transcript(answered["first"]) == references["decode"](expected.token_ids)
    assert expected.waveform is not None
    got, reference = np.frombuffer(output_audio(answered["first"]), "<i2"), pcm16(expected.waveform)
    assert len(got) == len(reference)  # code2wav's 24 kHz, untouched
    assert snr_db(reference, got) >= MIN_SNR_DB


def test_the_second_answer_is_generates_on_the_whole_conversation(answered: dict[str, Any], references: Any) -> None:
    expected: ReferenceOutput = references["second"]
    assert transcript(answered["second"]) == references["decode"](expected.token_ids)


async def test_a_g711_session_gets_the_answer_in_g711(server: Server, turns: dict[str, bytes], references: Any) -> None:
    pcmu = {"audio": {"input": {"turn_detection": None}, "output": {"format": {"type": "audio/pcmu"}}}}
    async with open_realtime(server.url.replace("http", "ws", 1) + "/v1/realtime") as rt:
        await start(rt, **GREEDY_SESSION, **pcmu)
        await commit(rt, turns["first"])
        events = await respond(rt)
    expected: ReferenceOutput = references["first"]
    assert expected.waveform is not None
    assert transcript(events) == references["decode"](expected.token_ids)
    heard = decode(output_audio(events), "pcmu")  # the codec itself is checked against audioop in test_telephony
    reference = soxr.resample(pcm16(expected.waveform).astype(np.float32), 24_000, TELEPHONY_RATE)
    assert abs(len(heard) - len(reference)) <= 2  # one byte a sample at 8 kHz
    n = min(len(heard), len(reference))
    assert snr_db(reference[EDGE : n - EDGE], heard[EDGE : n - EDGE]) >= MIN_G711_SNR_DB


async def test_a_text_only_session_is_answered_without_the_talker(server: Server, turns: dict[str, bytes]) -> None:
    async with open_realtime(server.url.replace("http", "ws", 1) + "/v1/realtime") as rt:
        await start(rt, output_modalities=["text"], **GREEDY_SESSION, **MANUAL)
        await commit(rt, turns["first"])
        events = await respond(rt)
    kinds = {e["type"] for e in events}
    assert "response.output_text.delta" in kinds and "response.output_audio.delta" not in kinds
    assert events[-1]["response"]["status"] == "completed"


async def test_input_transcription_without_an_asr_stage_is_an_error_naming_it(server: Server) -> None:
    asked = {"audio": {"input": {"turn_detection": None, "transcription": {"model": "whisper-1"}}}}
    async with open_realtime(server.url.replace("http", "ws", 1) + "/v1/realtime") as rt:
        await rt.receive()
        await rt.send({"type": "session.update", "session": {"type": "realtime", **asked}})
        error = (await rt.receive_until("error", timeout=60))[-1]["error"]
    assert (error["code"], error["param"]) == ("transcription_not_served", "session.audio.input.transcription")
    assert "ASR stage" in error["message"]


@pytest.fixture(scope="module")
def barged(server: Server, turns: dict[str, bytes]) -> dict[str, Any]:
    """A session with server VAD: the first turn, then the second said over its answer; the answer's
    events up to its ``response.done``, then its truncation at ``PLAYED_MS`` and the item retrieved."""

    async def session() -> dict[str, Any]:
        silence = bytes(2 * 24_000)
        async with open_realtime(server.url.replace("http", "ws", 1) + "/v1/realtime") as rt:
            await start(rt, instructions=INSTRUCTIONS, temperature=0)  # server VAD, the default
            first = base64.b64encode(turns["first"] + silence).decode()
            await rt.send({"type": "input_audio_buffer.append", "audio": first})
            first_audio = (await rt.receive_until("response.output_audio.delta", timeout=ANSWER_S))[-1]
            await rt.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(turns["second"]).decode()})
            events = await rt.receive_until("response.done", timeout=ANSWER_S)
            truncate = {"item_id": first_audio["item_id"], "content_index": 0, "audio_end_ms": PLAYED_MS}
            await rt.send({"type": "conversation.item.truncate", **truncate})
            truncated = (await rt.receive_until("conversation.item.truncated"))[-1]
            await rt.send({"type": "conversation.item.retrieve", "item_id": first_audio["item_id"]})
            item = (await rt.receive_until("conversation.item.retrieved"))[-1]["item"]
        return {"events": events, "truncated": truncated, "item": item}

    return trio.run(session)


def test_speaking_over_the_answer_cancels_it_and_the_client_truncates_it(barged: dict[str, Any]) -> None:
    types = [e["type"] for e in barged["events"]]
    assert "input_audio_buffer.speech_started" in types
    assert "response.output_audio.delta" not in types[types.index("input_audio_buffer.speech_started") :]
    assert barged["events"][-1]["response"]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
    assert barged["truncated"]["audio_end_ms"] == PLAYED_MS
    assert len(base64.b64decode(barged["item"]["content"][0]["audio"])) == 2 * 24 * PLAYED_MS


def test_every_stage_and_the_coordinator_let_the_interrupted_answer_go(barged: dict[str, Any], server: Server) -> None:
    health = trio.run(settled_server, server.url, 60)  # fails after 60 s, naming what is still held
    assert health["requests"] == 0
