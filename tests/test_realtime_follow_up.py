"""What the user says soon after a turn ended is heard, from its first word, as a turn of its own.

With synthesized speech on the default pipeline (the "repeat" responder): a complete question, the
silence that ends its turn, then a short gap and a follow-up. The follow-up must get its own
``speech_started``, be committed as its own item and be transcribed whole, for ``server_vad`` with a
short and the default silence and for ``semantic_vad``, and with false-interruption resume on
(the follow-up is then heard over the first answer, judged, and goes on as a turn).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import trio

from omnitrio.client import RealtimeClient, open_realtime
from tests.test_realtime_voice import pcm16, realtime_url, send_audio
from tests.test_turn_realtime import committed_transcripts, set_turn_detection
from toys.speech_text import heard_as

pytestmark = pytest.mark.slow
FIRST = "What is the capital of France?"
FOLLOW_UP = "Please call my sister."
GAPS = (0.2, 0.3, 0.45)
DETECTIONS: dict[
    str, tuple[dict[str, Any], int]
] = {  # each with the silence after speech that ends a complete turn (ms)
    "server_vad_200": ({"type": "server_vad", "silence_duration_ms": 200}, 200),
    "server_vad_500": ({"type": "server_vad", "silence_duration_ms": 500}, 500),
    "semantic_vad": ({"type": "semantic_vad", "eagerness": "high"}, 200),
    "server_vad_resuming": ({"type": "server_vad", "false_interruptions": {"decide_ms": 10_000}}, 500),
}


def voiced(text: str) -> bytes:
    """``text`` spoken (PCM16 24 kHz), from its first to its last voiced sample (above 1/20 of the peak)."""
    samples = np.frombuffer(pcm16(text, variation=0.0), "<i2")
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > np.abs(samples.astype(np.int32)).max() // 20)
    return samples[loud[0] : loud[-1] + 1].tobytes()


async def transcribed_turns(rt: RealtimeClient, count: int) -> list[dict[str, Any]]:
    """Every event until ``count`` user turns have been transcribed."""
    events: list[dict[str, Any]] = []
    with trio.fail_after(90):
        while sum(e["type"].endswith("input_audio_transcription.completed") for e in events) < count:
            events.append(await rt.receive())
    return events


@pytest.mark.parametrize("name", DETECTIONS)
async def test_a_follow_up_soon_after_a_turn_is_heard_from_its_first_word(name: str) -> None:
    detection, silence_ms = DETECTIONS[name]
    first, follow_up, end = bytes(24_000 // 5 * 2) + voiced(FIRST), voiced(FOLLOW_UP), bytes(2 * 24_000 * 3 // 2)
    async with realtime_url() as url:
        for gap in GAPS:
            quiet = bytes(2 * int(24_000 * (silence_ms / 1000 + gap)))
            async with open_realtime(url) as rt:
                await set_turn_detection(rt, detection)
                await send_audio(rt, first + quiet + follow_up + end)
                events = await transcribed_turns(rt, 2)
            types = [e["type"] for e in events]
            turns = committed_transcripts(events)
            assert types.count("input_audio_buffer.speech_started") == 2, f"gap {gap}: {turns}"
            assert len(turns) == 2 and heard_as(turns[0], FIRST), f"gap {gap}: {turns}"
            assert heard_as(turns[1], FOLLOW_UP), f"gap {gap}: the follow-up was heard as {turns[1]!r}"
