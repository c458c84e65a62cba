"""semantic_vad hears a pause with the turn model beside the transcript, not after it (no speech models).

At the early silence of a pause the turn model scores the audio on another thread while the words
are decoded, so the judgement at the pause waits for the longer of the two, never their sum.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from omnitrio.contract import OmniRequest
from schedulers.session import SESSION_METADATA_KEY
from schedulers.speech import turn_model
from schedulers.speech.streaming_asr import StreamingTranscriber

RATE = 16_000


class Ctx:
    pending = 0

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def emit(self, chunk: Any, modality: str = "text") -> None:
        if modality == "vad":
            self.events.append(chunk)


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
    monkeypatch.setattr(turn_model, "shared_turn_model", lambda threads=1: both)
    transcriber = StreamingTranscriber(both, vad_backend="energy")  # type: ignore[arg-type]
    config = {"sample_rate": RATE, "partial_every_ms": None, "turn_detection": {"type": "semantic_vad"}}
    state = transcriber.open(None, OmniRequest(metadata={SESSION_METADATA_KEY: {"config": config}}))  # type: ignore[arg-type]
    tone = (0.3 * np.sin(np.arange(RATE) * 0.2)).astype(np.float32)
    clip = np.concatenate([np.zeros(RATE // 2, np.float32), tone, np.zeros(RATE, np.float32)])
    ctx = Ctx()
    for start in range(0, clip.size, RATE * 2 // 100):
        transcriber.append(state, clip[start : start + RATE * 2 // 100], None, ctx)  # type: ignore[arg-type]
    judged = [event for event in ctx.events if event["type"] == "turn_judged"]
    assert both.met == [True]  # one decode, and the model was running beside it
    assert [(e["turn_complete"], e["probability"]) for e in judged] == [(True, 0.9)]
    assert [e["type"] for e in ctx.events].count("speech_stopped") == 1
