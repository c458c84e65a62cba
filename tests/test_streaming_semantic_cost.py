"""semantic_vad's work at a pause does not grow with the turn before it, and waits for the longer
of its parts, not their sum (no speech models).

A long turn with many short pauses (each past the early-transcript silence, none long enough to
judge) is transcribed as it goes; at each pause the recognizer is given the stretch since the last
one and a bounded context before it (from an earlier pause), never the whole turn again, so a long turn ends as soon
after its speech as a short one. At the early silence of a pause the turn model scores the audio on
another thread while the words are decoded.
"""

from __future__ import annotations

import threading
from typing import Any

import attrs
import numpy as np
import pytest

from omnitrio.contract import OmniRequest
from schedulers.session import SESSION_METADATA_KEY
from schedulers.speech import turn_model
from schedulers.speech.streaming_asr import CONTEXT_SAMPLES, StreamingTranscriber, merged_words

RATE = 16_000


@attrs.define
class CountingRecognizer:
    """Says a word per 0.5 s it is given; remembers how many samples each call decoded."""

    decoded: list[int] = attrs.field(factory=list)

    def transcribe(self, audio: Any, language: str | None = None, *, quick: bool = False) -> str:
        self.decoded.append(int(np.asarray(audio).size))
        return " ".join(["word"] * max(1, int(np.asarray(audio).size) // (RATE // 2))) + "."


class SureModel:
    def probability_complete(self, audio_16k: Any) -> float:
        return 0.99


class Ctx:
    pending = 0

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def emit(self, chunk: Any, modality: str = "text") -> None:
        if modality == "vad":
            self.events.append(chunk)


def tone(seconds: float) -> np.ndarray:
    return (0.3 * np.sin(np.arange(int(RATE * seconds)) * 0.2)).astype(np.float32)


def run_turn(monkeypatch: pytest.MonkeyPatch, stretches: int) -> tuple[CountingRecognizer, list[dict[str, Any]]]:
    """A turn of ``stretches`` 1 s stretches of speech, 150 ms apart, then 1 s of silence, fed in 40 ms pieces."""
    monkeypatch.setattr(turn_model, "shared_turn_model", lambda threads=1: SureModel())
    recognizer = CountingRecognizer()
    transcriber = StreamingTranscriber(recognizer, vad_backend="energy")  # type: ignore[arg-type]
    config = {"sample_rate": RATE, "partial_every_ms": None, "turn_detection": {"type": "semantic_vad"}}
    state = transcriber.open(None, OmniRequest(metadata={SESSION_METADATA_KEY: {"config": config}}))  # type: ignore[arg-type]
    gap = np.zeros(RATE * 15 // 100, np.float32)
    clip = np.concatenate(
        [np.zeros(RATE // 2, np.float32), *[np.concatenate([tone(1.0), gap]) for _ in range(stretches)]]
    )
    clip = np.concatenate([clip, np.zeros(RATE, np.float32)])
    ctx = Ctx()
    for start in range(0, clip.size, RATE * 4 // 100):
        transcriber.append(state, clip[start : start + RATE * 4 // 100], None, ctx)  # type: ignore[arg-type]
    return recognizer, ctx.events


def test_a_pause_of_a_long_turn_decodes_a_bounded_stretch(monkeypatch: pytest.MonkeyPatch) -> None:
    recognizer, events = run_turn(monkeypatch, stretches=8)
    assert [e["type"] for e in events].count("speech_stopped") == 1
    assert len(recognizer.decoded) >= 4  # the turn was transcribed at its pauses, as it went
    assert max(recognizer.decoded) <= CONTEXT_SAMPLES + 4 * RATE  # never the whole (9 s) turn again


def test_a_long_turn_is_judged_on_as_little_new_audio_as_a_short_one(monkeypatch: pytest.MonkeyPatch) -> None:
    short, _ = run_turn(monkeypatch, stretches=1)
    long, _ = run_turn(monkeypatch, stretches=8)
    assert long.decoded[-1] <= short.decoded[-1] + CONTEXT_SAMPLES + 1.5 * RATE  # its stretch, a bounded context


def test_words_decoded_with_context_join_the_known_ones_where_they_overlap() -> None:
    assert merged_words("What is the capital.", "the capital of France?") == "What is the capital of France?"
    assert merged_words("What is the capital", "pital of France?") is None  # no two words in common
    assert merged_words("Book a table for", "a table for four, please.") == "Book a table for four, please."
    assert merged_words("Book a table", "uh, table for two.") is None
    assert merged_words("Hello.", "Oh hello there.") == "hello there."


def one_pause(monkeypatch: pytest.MonkeyPatch, both: Any, ctx: Ctx) -> Ctx:
    """A semantic_vad turn of 1 s of tone then 1 s of silence, fed in 20 ms pieces; ``both`` is the
    recognizer and the turn model."""
    monkeypatch.setattr(turn_model, "shared_turn_model", lambda threads=1: both)
    transcriber = StreamingTranscriber(both, vad_backend="energy")
    config = {"sample_rate": RATE, "partial_every_ms": None, "turn_detection": {"type": "semantic_vad"}}
    state = transcriber.open(None, OmniRequest(metadata={SESSION_METADATA_KEY: {"config": config}}))  # type: ignore[arg-type]
    clip = np.concatenate([np.zeros(RATE // 2, np.float32), tone(1.0), np.zeros(RATE, np.float32)])
    for start in range(0, clip.size, RATE * 2 // 100):
        transcriber.append(state, clip[start : start + RATE * 2 // 100], None, ctx)  # type: ignore[arg-type]
    return ctx


class Together:
    """A recognizer and a model that each wait (bounded) for the other to be running."""

    def __init__(self) -> None:
        self.decoding, self.scoring = threading.Event(), threading.Event()
        self.met: list[bool] = []

    def transcribe(self, audio: Any, language: str | None = None, *, quick: bool = False) -> str:
        self.decoding.set()
        self.met.append(self.scoring.wait(10))
        return "Please send the report."

    def probability_complete(self, audio_16k: Any) -> float:
        self.scoring.set()
        self.decoding.wait(10)
        return 0.9


def test_the_turn_model_scores_the_pause_while_its_words_are_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    both = Together()
    ctx = one_pause(monkeypatch, both, Ctx())
    judged = [event for event in ctx.events if event["type"] == "turn_judged"]
    assert both.met == [True]  # one decode, and the model was running beside it
    assert [(e["turn_complete"], e["probability"]) for e in judged] == [(True, 0.9)]
    assert [e["type"] for e in ctx.events].count("speech_stopped") == 1


class DoubtfulFirst:
    """A recognizer of complete words, and a model unsure of the early audio, sure of the longer."""

    def __init__(self) -> None:
        self.scored: list[int] = []

    def transcribe(self, audio: Any, language: str | None = None, *, quick: bool = False) -> str:
        return "Please send the report."

    def probability_complete(self, audio_16k: Any) -> float:
        self.scored.append(int(np.asarray(audio_16k).size))
        return 0.2 if len(self.scored) == 1 else 0.9


def test_a_pause_the_early_audio_left_in_doubt_is_scored_again_on_the_audio_to_the_pause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    both = DoubtfulFirst()
    ctx = one_pause(monkeypatch, both, Ctx())
    judged = [event for event in ctx.events if event["type"] == "turn_judged"]
    assert [(e["turn_complete"], e["probability"]) for e in judged] == [(True, 0.9)]
    assert len(both.scored) == 2 and both.scored[1] > both.scored[0]  # the second heard the whole pause


class SaysFirst(Ctx):
    """Notes when ``speech_paused`` (the words) has been said."""

    def __init__(self) -> None:
        super().__init__()
        self.said = threading.Event()

    def emit(self, chunk: Any, modality: str = "text") -> None:
        super().emit(chunk, modality)
        if modality == "vad" and chunk["type"] == "speech_paused":
            self.said.set()


def test_the_words_of_a_pause_are_said_before_the_turn_model_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = SaysFirst()
    waited: list[bool] = []

    class Slow(DoubtfulFirst):
        def probability_complete(self, audio_16k: Any) -> float:
            waited.append(ctx.said.wait(10))  # the model answers only once the words were said
            return 0.9

    both = Slow()
    one_pause(monkeypatch, both, ctx)
    assert waited == [True]
    assert [e["type"] for e in ctx.events].count("speech_stopped") == 1
