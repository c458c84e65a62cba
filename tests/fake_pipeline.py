"""A toy pipeline with the real pipeline's serving API, for testing ``omnitrio.serve`` alone.

It follows the input/output convention of ``omnitrio.serve`` (see its docstring) and records what
the server did to each request: the inputs it was given, and whether its stream was left before
the end (an abort) and when. Words in the request text pick a behaviour:

- ``overload``: ``Overloaded`` when the stream is entered (admission refused)
- ``fail``: one text chunk, then ``RequestFailed`` from stage ``fake``
- ``toolong``: ``BadRequest`` ``context_length_exceeded`` before any output (a stage refused it)
- ``timeout``: ``RequestTimeout`` when the stream is entered
- ``slow``: 400 chunks 5 ms apart, so a client can leave in the middle
- ``mute``: no audio at all, whatever the task

A transcription that asks for ``timestamps`` gets ``language``, one segment and timed ``words``.
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import numpy as np
import prometheus_client
import trio

from omnitrio.errors import BadRequest, DuplicateRequest, Overloaded, RequestAborted, RequestFailed, RequestTimeout
from omnitrio.messages import CompleteMessage, StreamMessage

STAGE = "fake"


@attrs.define(eq=False)
class FakeRequest:
    """What happened to one request: its inputs, and how and when its stream was left."""

    request_id: str
    inputs: Any
    outcome: str | None = None  # "completed" | "aborted" | "failed"
    exited_at: float | None = None
    exited: trio.Event = attrs.field(factory=trio.Event)
    abort_requested: trio.Event = attrs.field(factory=trio.Event)


def request_text(inputs: Any) -> str:
    match inputs:
        case {"task": "chat", "messages": [*_, {"content": str(content)}]}:
            return content
        case {"task": "speech", "input": str(text)}:
            return text
        case {"task": "transcription", "prompt": str(prompt)}:
            return prompt
    return ""


def tone(seconds: float, rate: int, *, as_float: bool = False) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    wave = 0.3 * np.sin(2 * math.pi * 440.0 * t)
    return wave.astype(np.float32) if as_float else (wave * 32767).astype(np.int16)


class FakePipeline:
    """Answers every task with toy text and 440 Hz tones at ``audio_rate`` (0.1 s per word)."""

    def __init__(self, name: str = "fake-omni", *, audio_rate: int = 16_000) -> None:
        self.name = name
        self.audio_rate = audio_rate
        self.alive = True
        self.metrics_registry = prometheus_client.CollectorRegistry()
        self._counter = prometheus_client.Counter(
            "fake_requests", "requests the fake pipeline admitted", registry=self.metrics_registry
        )
        self.live: dict[str, FakeRequest] = {}
        self.history: list[FakeRequest] = []
        self._arrivals_send, self.arrivals = trio.open_memory_channel[FakeRequest](math.inf)

    async def idle(self, timeout: float = 5.0) -> None:
        """Return once no request is live: each one's stream has exited (``trio.TooSlowError`` after ``timeout``)."""
        with trio.fail_after(timeout):
            while self.live:
                await next(iter(self.live.values())).exited.wait()

    @asynccontextmanager
    async def stream(
        self, request_id: str, inputs: Any, *, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> AsyncIterator[AsyncIterator[StreamMessage | CompleteMessage]]:
        if request_id in self.live:
            raise DuplicateRequest(request_id, f"request {request_id!r} is live")
        words = request_text(inputs).split()
        if "overload" in words:
            raise Overloaded(request_id, "the fake pipeline is full")
        if "timeout" in words:
            raise RequestTimeout(request_id, 0.01)
        request = FakeRequest(request_id, inputs)
        self._counter.inc()
        self.live[request_id] = request
        self.history.append(request)
        self._arrivals_send.send_nowait(request)
        messages = self._messages(request, words)
        try:
            yield messages
        except RequestFailed:
            request.outcome = "failed"
            raise
        finally:
            await messages.aclose()
            if request.outcome is None:
                request.outcome = "aborted"
            request.exited_at = trio.current_time()
            del self.live[request_id]
            request.exited.set()

    async def _messages(
        self, request: FakeRequest, words: list[str]
    ) -> AsyncGenerator[StreamMessage | CompleteMessage, None]:
        rid, inputs = request.request_id, request.inputs
        task = inputs["task"]
        reply = self._reply(inputs)
        with_audio = "mute" not in words and (task in ("speech", "realtime") or "audio" in inputs.get("modalities", ()))
        with_text = task in ("chat", "transcription")
        chunk_id = 0
        count = 400 if "slow" in words else len(reply)
        if "toolong" in words:
            request.outcome = "failed"
            message = "This model's maximum context length is 1024 tokens. However, you requested 2000 tokens."
            raise BadRequest(rid, STAGE, message, "context_length_exceeded", "messages")
        for i in range(count):
            if request.abort_requested.is_set():
                raise RequestAborted(rid)
            if "slow" in words:
                await trio.sleep(0.005)
            word = reply[i % len(reply)] + " "
            if "fail" in words and i == 1:
                raise RequestFailed(rid, STAGE, "ValueError", "fake failure on purpose")
            if with_text:
                yield StreamMessage(rid, STAGE, chunk_id, word, "text")
                chunk_id += 1
            if with_audio:
                pcm = tone(0.1, self.audio_rate, as_float=task == "speech")
                yield StreamMessage(rid, STAGE, chunk_id, {"pcm": pcm, "sample_rate": self.audio_rate}, "audio")
                yield StreamMessage(rid, STAGE, chunk_id + 1, word, "transcript")
                chunk_id += 2
        text = " ".join(reply) + " "
        request.outcome = "completed"
        usage = {"prompt_tokens": len(words), "completion_tokens": len(reply)}
        result: dict[str, Any] = {"text": text, "transcript": text, "usage": usage}
        if inputs.get("timestamps") is not None:  # a timed transcript: one segment, a word per 0.1 s
            seconds = inputs["audio"].size / 16_000
            result |= {"language": "english", "segments": [{"id": 0, "start": 0.0, "end": seconds, "text": text}]}
            result["words"] = [{"word": w, "start": i / 10, "end": (i + 1) / 10} for i, w in enumerate(reply)]
        yield CompleteMessage(rid, STAGE, result)

    def _reply(self, inputs: dict[str, Any]) -> list[str]:
        match inputs["task"]:
            case "chat" | "speech":
                return ["echo:", *request_text(inputs).split()]
            case "transcription" | "realtime":
                return ["heard", f"{inputs['audio'].size / 16_000:.2f}", "seconds"]
        raise ValueError(f"unknown task {inputs['task']!r}")

    async def abort(self, request_id: str, *, wait: bool = False) -> bool:
        request = self.live.get(request_id)
        if request is None:
            return False
        request.abort_requested.set()
        if wait:
            await request.exited.wait()
        return True

    async def refresh_stage_gauges(self) -> None:
        return

    async def health(self) -> dict[str, Any]:
        stage = {
            "alive": self.alive,
            "pid": os.getpid(),
            "process": "main",
            "active_requests": len(self.live),
            "restarts": 0,
        }
        return {"requests": len(self.live), "stages": {STAGE: stage}}


@attrs.frozen
class Served:
    """A live in-process server on a free port, serving ``fake``."""

    fake: FakePipeline
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"


async def start_server(nursery: trio.Nursery, fake: FakePipeline | None = None, **options: Any) -> Served:
    """Start ``omnitrio.serve.serve`` on port 0 in ``nursery`` (no signal handling; 1 MiB body limit)."""
    from functools import partial

    from omnitrio.serve import serve

    fake = fake or FakePipeline()
    options = {"handle_signals": False, "graceful_timeout": 0.5, "max_body_bytes": 1 << 20, **options}
    port = await nursery.start(partial(serve, fake, port=0, **options))
    return Served(fake, port)
