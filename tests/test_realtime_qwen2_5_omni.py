"""Realtime speech-native sessions with Qwen2.5-Omni (``--config configs/qwen2.5-omni.toml --model DIR``) on a
tiny checkpoint, as tests/test_realtime_speech_native.py holds them for Qwen3-Omni (its session helpers).

Greedy (session ``temperature`` 0, ``talker.factory.do_sample=false``): the first spoken turn's transcript
is ``generate``'s on the same samples brought to 16 kHz as the server does, and its audio is as long as
``generate``'s (the talker spoke the same codes; the streamed DiT is windowed, so its samples are close to,
not equal to, the whole decode's); the second turn's transcript is ``generate``'s on the whole conversation
(system = instructions, the audio, ``generate``'s own first answer as text, a text item, the next audio).
A cancelled answer leaves nothing held by any stage or the coordinator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("piper", reason="the test's speech comes from the speech extra's Piper voice")

from omnitrio.client import open_realtime
from tests import qwen2_5_omni_reference as ref
from tests.pipelines import settled_server
from tests.qwen2_5_omni_reference import reference_model, tiny_checkpoint  # noqa: F401  (fixtures model, tiny)
from tests.realtime_events import output_audio
from tests.test_realtime_speech_native import (
    ANSWER_S,
    FIRST,
    GREEDY_SESSION,
    INSTRUCTIONS,
    MANUAL,
    SECOND,
    TOKENS,
    TYPED,
    commit,
    start,
    transcript,
    two_turns,
)
from toys.browser import Server
from toys.realtime_omni import NO_ASR, QWEN2_5_CONFIG, QWEN2_5_GREEDY, as_heard, serve_omni, spoken

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def server(tiny: Path) -> Any:
    with serve_omni(tiny, (*QWEN2_5_GREEDY, NO_ASR), config=QWEN2_5_CONFIG) as running:
        yield running


@pytest.fixture(scope="module")
def turns() -> dict[str, bytes]:
    return {"first": spoken(FIRST), "second": spoken(SECOND)}


@pytest.fixture(scope="module")
def references(tiny: Path, model: Any, turns: dict[str, bytes]) -> dict[str, Any]:
    """``generate`` on the first turn, and on the conversation the second turn answers (with the first
    turn's answer as ``generate`` gave it, decoded as the server keeps an answer: its transcript)."""
    processor = ref.reference_processor(tiny)

    def said(answer: ref.Answer) -> str:
        return str(processor.tokenizer.decode(answer.ids, skip_special_tokens=True))

    system = {"role": "system", "content": INSTRUCTIONS}
    first = {"role": "user", "content": [{"type": "audio", "audio": as_heard(turns["first"])}]}
    second = {"role": "user", "content": [{"type": "audio", "audio": as_heard(turns["second"])}]}
    answer = ref.reference_answer(model, processor, [system, first], max_new_tokens=TOKENS)
    typed = {"role": "user", "content": TYPED}
    conversation: list[dict[str, Any]] = [system, first, {"role": "assistant", "content": said(answer)}, typed, second]
    again = ref.reference_answer(model, processor, conversation, max_new_tokens=TOKENS)
    assert answer.wav is not None
    return {"first": said(answer), "samples": answer.wav.numel(), "second": said(again)}


@pytest.fixture(scope="module")
def answered(server: Server, turns: dict[str, bytes]) -> dict[str, Any]:
    return two_turns(server, turns)


def test_a_spoken_turn_is_answered_with_generates_transcript_and_as_much_audio(
    answered: dict[str, Any], references: dict[str, Any]
) -> None:
    assert answered["first"][-1]["response"]["status"] == "completed"
    assert transcript(answered["first"]) == references["first"]
    assert len(output_audio(answered["first"])) == 2 * references["samples"]  # token2wav's 24 kHz pcm16


def test_the_second_answer_is_generates_on_the_whole_conversation(
    answered: dict[str, Any], references: dict[str, Any]
) -> None:
    assert transcript(answered["second"]) == references["second"]


async def test_a_cancelled_answer_frees_every_stage(server: Server, turns: dict[str, bytes]) -> None:
    async with open_realtime(server.url.replace("http", "ws", 1) + "/v1/realtime") as rt:
        await start(rt, **GREEDY_SESSION, **MANUAL)
        await commit(rt, turns["first"])
        await rt.send({"type": "response.create"})
        await rt.receive_until("response.output_audio.delta", timeout=ANSWER_S)
        await rt.send({"type": "response.cancel"})
        done = (await rt.receive_until("response.done", timeout=ANSWER_S))[-1]
    assert done["response"]["status"] in ("cancelled", "completed")  # the answer may have ended first
    health = await settled_server(server.url, 60)  # fails after 60 s, naming what is still held
    assert health["requests"] == 0
