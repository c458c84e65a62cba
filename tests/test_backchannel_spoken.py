"""A backchannel over a spoken answer, as a user meets it: ``python -m omnitrio serve`` (the default
pipeline: Whisper, SmolLM2 on llama.cpp, Piper), the official ``openai`` SDK's realtime client, and a
microphone that sends audio in real time (silence when nobody speaks).

The session opts in to false interruptions (``turn_detection.false_interruptions``, with
``semantic_vad``). The user asks for a long story aloud; one second after the answer's first audio
they say "Okay." (then silence): the answer is paused, then resumes, and is not cancelled. A real
question said at the same moment cancels it. Speech comes from the server's own voice
(``/v1/audio/speech``); every wait is for an event, the microphone's clock is the only timer.
"""

from __future__ import annotations

import base64
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import attrs
import openai
import pytest
import trio

from tests.test_realtime_conformance import Server, served

pytest.importorskip("piper", reason="the speech extra is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # its server loads the speech pipeline

RATE = 24_000
FRAME = 2 * RATE // 10  # 100 ms of PCM16: what the microphone sends at a time
DETECTION = {"type": "semantic_vad", "eagerness": "auto", "false_interruptions": {}}
QUESTION = "Please tell me a long story about a dragon who learns to fly."
BACKCHANNEL = "Okay."
INTERRUPTION = "Wait, what is the capital of France?"
PAUSED, RESUMED = "omnitrio.output_audio_buffer.paused", "omnitrio.output_audio_buffer.resumed"
HEARD_AFTER_RESUME = 2.0  # seconds of the answer's audio after the resume that show it goes on


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """The default pipeline as ``python -m omnitrio serve`` starts it: SmolLM2 answers."""
    with served() as started:
        yield started


class Microphone:
    """Sends 100 ms of audio every 100 ms of wall time, as a client's microphone does: what it was
    told to say (:meth:`say` queues it and returns at once), else silence."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.frames: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Microphone:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(5)

    def say(self, pcm: bytes) -> None:
        for i in range(0, len(pcm), FRAME):
            self.frames.put(pcm[i : i + FRAME])

    def _run(self) -> None:
        tick = time.monotonic()
        while not self.stopped.is_set():
            try:
                frame = self.frames.get_nowait()
            except queue.Empty:
                frame = bytes(FRAME)
            try:
                self.connection.input_audio_buffer.append(audio=base64.b64encode(frame).decode())
            except Exception:
                return  # the connection closed
            tick += 0.1
            time.sleep(max(0.0, tick - time.monotonic()))


@attrs.define
class Exchange:
    """What the client saw: every event with its arrival time, the answer's id, and when the user
    began saying ``over``."""

    events: list[tuple[float, Any]] = attrs.field(factory=list)
    answer: str | None = None
    over_at: float | None = None

    def types(self) -> list[str]:
        return [e.type for _, e in self.events]

    def of_answer(self, kind: str) -> list[Any]:
        return [e for _, e in self.events if e.type == kind and getattr(e, "response_id", None) == self.answer]

    def answer_done(self) -> Any:
        done = [e.response for _, e in self.events if e.type == "response.done" and e.response.id == self.answer]
        return done[0] if done else None

    def timeline(self) -> str:
        """Every event but the deltas, timed from when ``over`` began (for a failure's message)."""
        start = self.over_at or 0.0
        lines = []
        for at, event in self.events:
            if event.type in ("response.output_audio.delta", "response.output_audio_transcript.delta"):
                continue
            detail = ""
            if event.type == "response.done":
                details = event.response.status_details
                detail = f" {event.response.status} {getattr(details, 'reason', None)}"
            elif event.type in (RESUMED, "conversation.item.input_audio_transcription.completed"):
                detail = f" {getattr(event, 'transcript', '')!r}"
            lines.append(f"{at - start:+7.2f} s {event.type}{detail}")
        return "\n".join(lines)


def speak_over_the_answer(server: Server, question: bytes, over: bytes) -> Exchange:
    """Ask ``question`` aloud; one second after the answer's first audio say ``over``. The events
    until the answer is done, or until it has gone on ``HEARD_AFTER_RESUME`` s past a resume (then
    the client cancels it)."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    seen = Exchange()
    with client.realtime.connect(model="omnitrio-speech") as connection:
        watchdog = threading.Timer(240, connection.close)  # a server that goes silent fails the test
        watchdog.start()

        def receive() -> Any:
            event = connection.recv()
            seen.events.append((time.monotonic(), event))
            return event

        try:
            while receive().type != "session.created":
                continue
            session = {"type": "realtime", "omnitrio_events": True, "audio": {"input": {"turn_detection": DETECTION}}}
            connection.session.update(session=session)  # type: ignore[arg-type]
            while (event := receive()).type != "session.updated":
                continue
            echoed = event.session.audio.input.turn_detection.model_dump(exclude_none=True)
            assert {key: echoed.get(key) for key in DETECTION} == DETECTION, echoed
            with Microphone(connection) as microphone:
                microphone.say(question)
                while (event := receive()).type != "response.output_audio.delta":
                    continue
                seen.answer = event.response_id
                first_audio = time.monotonic()
                after_resume: float | None = None  # seconds of the answer's audio since it resumed
                while seen.answer_done() is None:
                    if seen.over_at is None and time.monotonic() >= first_audio + 1.0:
                        seen.over_at = time.monotonic()
                        microphone.say(over)
                    event = receive()
                    if getattr(event, "response_id", None) != seen.answer:
                        continue
                    if event.type == RESUMED:
                        after_resume = 0.0
                    elif event.type == "response.output_audio.delta" and after_resume is not None:
                        after_resume += len(base64.b64decode(event.delta)) / 2 / RATE
                        if after_resume >= HEARD_AFTER_RESUME:
                            connection.response.cancel()  # it went on: enough to know
                            after_resume = None
        finally:
            watchdog.cancel()
    return seen


async def exchange(server: Server, over_text: str, silence_after: float) -> Exchange:
    question = await trio.to_thread.run_sync(server.speech, QUESTION, 1.0)
    over = await trio.to_thread.run_sync(server.speech, over_text, silence_after)
    with trio.fail_after(300):
        return await trio.to_thread.run_sync(speak_over_the_answer, server, question, over, abandon_on_cancel=True)


async def test_okay_over_a_spoken_answer_pauses_it_then_it_resumes_and_is_not_cancelled(server: Server) -> None:
    seen = await exchange(server, BACKCHANNEL, 1.5)
    types = seen.types()
    paused, resumed = seen.of_answer(PAUSED), seen.of_answer(RESUMED)
    assert paused and resumed, f"paused {len(paused)}, resumed {len(resumed)}:\n{seen.timeline()}"
    assert types.index(PAUSED) < types.index(RESUMED), seen.timeline()
    done = seen.answer_done()
    reason = getattr(done.status_details, "reason", None)
    assert done.status == "completed" or reason == "client_cancelled", seen.timeline()
    over_on = next(i for i, (at, _) in enumerate(seen.events) if at >= (seen.over_at or 0.0))
    assert "input_audio_buffer.committed" not in types[over_on:], seen.timeline()  # "Okay." is no turn


async def test_a_question_over_a_spoken_answer_cancels_it(server: Server) -> None:
    seen = await exchange(server, INTERRUPTION, 1.5)
    assert seen.of_answer(PAUSED) and not seen.of_answer(RESUMED), seen.timeline()
    done = seen.answer_done()
    reason = getattr(done.status_details, "reason", None)
    assert (done.status, reason) == ("cancelled", "turn_detected"), seen.timeline()
