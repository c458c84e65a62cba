"""The TTS scheduler serves the user who is waiting first: a response's first sentence before another's later ones."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from omnitrio.contract import IncomingMessage, OmniRequest, StagePayload
from schedulers.speech.audio import FloatAudio
from schedulers.speech.tts_scheduler import SentenceStreamingTTSScheduler


class RecordingSynthesizer:
    """Says every sentence as 10 ms of tone, in the order asked; ``on_sentence`` runs first."""

    name = "recording"
    sample_rate = 24_000

    def __init__(self) -> None:
        self.said: list[str] = []
        self.on_sentence: Callable[[str], None] = lambda text: None

    def synthesize(self, text: str, speed: float = 1.0) -> FloatAudio:
        self.on_sentence(text)
        self.said.append(text)
        return np.full(240, 0.1, dtype=np.float32)


def speech(rid: str, text: str) -> IncomingMessage:
    request = OmniRequest(params={"stream": True})
    inputs = {"task": "speech", "input": text, "voice": "alloy"}
    return IncomingMessage(rid, "new_request", StagePayload(rid, request, {"raw_inputs": inputs}))


def test_a_new_answers_first_sentence_goes_before_a_long_answers_next_sentences() -> None:
    synthesizer = RecordingSynthesizer()
    scheduler = SentenceStreamingTTSScheduler(synthesizer)
    long = speech("long", "Long one. Long two. Long three.")
    waiting = speech("waiting", "Waiting one. Waiting two.")

    def arrive(text: str) -> None:
        if text == "Long one.":  # the second user's answer comes while the first answer is being said
            scheduler.inbox.put(waiting)

    synthesizer.on_sentence = arrive
    scheduler.inbox.put(long)
    thread = threading.Thread(target=scheduler.start, daemon=True)
    thread.start()
    results: set[str] = set()
    while len(results) < 2:
        message = scheduler.outbox.get(timeout=30)
        if message.type == "result":
            results.add(message.request_id)
    scheduler.stop()
    thread.join(10)
    assert synthesizer.said[:3] == ["Long one.", "Waiting one.", "Long two."]
