"""TTS: sentence splitting, sentence-by-sentence streaming, abort between sentences."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from omnitrio.contract import IncomingMessage, OmniRequest, OutgoingMessage, StagePayload
from schedulers.speech.tts import check_speed, complete_sentences_end, split_sentences
from tests.scheduler_harness import running
from toys.debian import ensure

TWO_SENTENCES = "The weather is lovely today. Let us go for a walk in the park."

pytestmark = pytest.mark.timeout(300)  # loads Piper: past the global 120 s when busy


def test_split_sentences_keeps_abbreviations_and_quotes() -> None:
    text = 'Dr. Smith arrived. "Is it done?" she asked!\nYes'
    assert split_sentences(text) == ["Dr. Smith arrived.", '"Is it done?"', "she asked!", "Yes"]


@pytest.mark.parametrize(
    ("written", "ready"),
    [
        ("The forecast for Paris today, ", "The forecast for Paris today, "),  # the first phrase, on its own
        ("I think the answer is yes - but", "I think the answer is yes - "),
        ("Sure, the forecast", ""),  # too short an opener: it waits for more words
        ("Sure, the forecast for Paris", ""),
        ("It is sunny. Later today, it", "It is sunny. "),  # after the first sentence: whole sentences only
        ("It costs 1,000 dollars and more", ""),  # a comma inside a number is no clause break
    ],
)
def test_an_answers_first_phrase_is_ready_before_its_first_sentence_ends(written: str, ready: str) -> None:
    assert written[: complete_sentences_end(written)] == ready


def test_what_is_ready_to_say_only_grows_as_the_answer_is_written() -> None:
    answer = "Well, the forecast for today, as far as I know, is sunny. Take a hat, it is hot."
    ends = [complete_sentences_end(answer[:n]) for n in range(len(answer) + 1)]
    assert ends == sorted(ends)


def test_speed_outside_openai_range_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"speed must be a number between 0.25 and 4.0, got 5"):
        check_speed(5)


@pytest.fixture(scope="module")
def tts_stage() -> Iterator[Any]:
    pytest.importorskip("piper", reason="the speech extra (piper-tts) is not installed")
    from schedulers.speech.stages import create_tts_stage

    with running(create_tts_stage(), warm_up=True) as stage:
        yield stage


def speech(rid: str, text: str, *, stream: bool = True, speed: Any = 1.0) -> IncomingMessage:
    request = OmniRequest(params={"stream": stream})
    inputs = {"task": "speech", "input": text, "voice": "alloy", "speed": speed}
    return IncomingMessage(rid, "new_request", StagePayload(rid, request, {"raw_inputs": inputs}))


def until_final(scheduler: Any, rid: str, timeout: float = 30) -> list[OutgoingMessage]:
    outputs: list[OutgoingMessage] = []
    while not outputs or outputs[-1].type not in ("result", "error"):
        message = scheduler.outbox.get(timeout=timeout)
        assert message.request_id == rid
        outputs.append(message)
    return outputs


def test_two_sentences_stream_as_at_least_two_pcm16_chunks_then_a_result(tts_stage: Any) -> None:
    tts_stage.inbox.put(speech("two", TWO_SENTENCES))
    *chunks, result = until_final(tts_stage, "two")
    assert len(chunks) >= 2
    assert all(c.type == "stream" and c.metadata == {"modality": "audio"} for c in chunks)
    assert all(c.data["pcm"].dtype == np.int16 and c.data["sample_rate"] == 24_000 for c in chunks)
    total = sum(c.data["pcm"].size for c in chunks)
    assert result.data.data == {"transcript": TWO_SENTENCES, "sample_rate": 24_000, "num_samples": total}
    assert total > 24_000  # two sentences last well over a second


def test_non_streaming_request_returns_the_whole_clip_in_the_result(tts_stage: Any) -> None:
    tts_stage.inbox.put(speech("whole", "Hello.", stream=False))
    (result,) = until_final(tts_stage, "whole")
    assert result.type == "result"
    assert result.data.data["pcm"].size == result.data.data["num_samples"] > 0


def test_abort_stops_further_chunks(tts_stage: Any) -> None:
    text = " ".join(f"This is sentence number {n} of a long answer." for n in range(1, 9))
    tts_stage.inbox.put(speech("long", text))
    first = tts_stage.outbox.get(timeout=30)
    assert (first.request_id, first.type) == ("long", "stream")
    tts_stage.abort("long")
    tts_stage.inbox.put(speech("after", "Done."))
    later = until_final_skipping_long(tts_stage)
    assert [m.request_id for m in later if m.request_id == "long"] == []


def until_final_skipping_long(scheduler: Any) -> list[OutgoingMessage]:
    """Everything after the abort, up to the result of the next request ("after")."""
    outputs: list[OutgoingMessage] = []
    deadline = time.monotonic() + 30
    while not (outputs and outputs[-1].request_id == "after" and outputs[-1].type == "result"):
        outputs.append(scheduler.outbox.get(timeout=max(0.0, deadline - time.monotonic())))
    return outputs


def test_empty_input_is_an_error_naming_the_field(tts_stage: Any) -> None:
    tts_stage.inbox.put(speech("empty", "   "))
    (error,) = until_final(tts_stage, "empty")
    assert error.type == "error" and "input" in str(error.data)


def test_bad_speed_is_an_error(tts_stage: Any) -> None:
    tts_stage.inbox.put(speech("fast", "Hello.", speed=9))
    (error,) = until_final(tts_stage, "fast")
    assert error.type == "error" and "speed" in str(error.data)


def test_espeak_ng_fallback_speaks_when_installed() -> None:

    if (missing := ensure("espeak-ng", "espeak-ng")) is not None:
        pytest.skip(missing)
    from schedulers.speech.tts import load_synthesizer, synthesize_sentences

    tts = load_synthesizer("espeak-ng")
    clips = list(synthesize_sentences(tts, TWO_SENTENCES))
    assert len(clips) == 2
    assert all(clip.dtype == np.float32 and np.abs(clip).max() > 0.1 for clip in clips)
    assert tts.sample_rate == 22_050


def test_piper_without_variation_gives_the_same_samples_every_time() -> None:
    pytest.importorskip("piper", reason="the speech extra (piper-tts) is not installed")
    from schedulers.speech.tts import shared_synthesizer

    steady, varied = shared_synthesizer("piper", variation=0.0), shared_synthesizer("piper")
    assert np.array_equal(steady.synthesize("Hello there."), steady.synthesize("Hello there."))
    first, second = varied.synthesize("Hello there."), varied.synthesize("Hello there.")
    assert first.shape != second.shape or not np.array_equal(first, second)


def test_piper_variation_outside_zero_to_one_is_rejected_by_name() -> None:
    pytest.importorskip("piper", reason="the speech extra (piper-tts) is not installed")
    from schedulers.speech.tts import PiperSynthesizer

    with pytest.raises(ValueError, match=r"variation must be a number between 0.0 and 1.0, got 2"):
        PiperSynthesizer(variation=2)
