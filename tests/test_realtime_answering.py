"""A realtime session answers through its ``Answering``, whatever pipeline that is; the cascade is one."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from omnitrio.serve.context import ServeContext
from omnitrio.serve.output import Delta, Output
from omnitrio.serve.realtime.answering import AnswerRequest
from omnitrio.serve.realtime.cascade import Cascade
from omnitrio.serve.realtime.session import RealtimeSession
from omnitrio.serve.realtime.transport import ClientEvent, Incoming


class Transport:
    """Client events in through a channel; every server event kept, ``response.done`` signalled."""

    def __init__(self) -> None:
        self.incoming, self._incoming = trio.open_memory_channel[Incoming | None](16)
        self.sent: list[dict[str, Any]] = []
        self.done = trio.Event()

    async def receive(self) -> Incoming | None:
        return await self._incoming.receive()

    async def send(self, event: dict[str, Any]) -> None:
        self.sent.append(event)
        if event["type"] == "response.done":
            self.done.set()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        pass


class Pipeline:
    """A pipeline that records the tasks it was asked for and streams nothing."""

    name = "odd"
    metrics_registry = None

    def __init__(self) -> None:
        self.tasks: list[str] = []

    @asynccontextmanager
    async def stream(self, request_id: str, inputs: Any, **_: Any) -> AsyncIterator[Any]:
        self.tasks.append(inputs.get("task"))

        async def nothing() -> AsyncIterator[Any]:
            return
            yield

        yield nothing()

    async def abort(self, request_id: str, *, wait: bool = False) -> bool:
        return False


class Spoken:
    """An ``Answering`` that needs no transcript and no ``chat`` task: it answers with one fixed text."""

    def __init__(self) -> None:
        self.requests: list[AnswerRequest] = []

    async def ready(self, request: AnswerRequest) -> bool:
        return True

    async def answer(self, request: AnswerRequest, output: Output, send: Callable[[Delta], None]) -> None:
        self.requests.append(request)
        send(Delta("text", "heard you"))

    async def release(self, request_id: str) -> None:
        pass


def event(**fields: Any) -> ClientEvent:
    return ClientEvent(json.dumps(fields))


async def test_a_session_answers_through_the_answering_it_is_given_and_not_the_pipelines_chat() -> None:
    pipeline, transport, spoken = Pipeline(), Transport(), Spoken()
    session = RealtimeSession(ServeContext(pipeline), transport)
    assert isinstance(session.answering, Cascade)  # the default
    session.answering = spoken
    async with trio.open_nursery() as nursery:
        nursery.start_soon(session.run)
        text_only = {"type": "realtime", "output_modalities": ["text"], "audio": {"input": {"turn_detection": None}}}
        await transport.incoming.send(event(type="session.update", session=text_only))
        message = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}
        await transport.incoming.send(event(type="conversation.item.create", item=message))
        await transport.incoming.send(event(type="response.create"))
        with trio.fail_after(10):
            await transport.done.wait()
        await transport.incoming.send(None)
    deltas = [e["delta"] for e in transport.sent if e["type"] == "response.output_text.delta"]
    done = next(e for e in transport.sent if e["type"] == "response.done")
    assert (deltas, done["response"]["status"]) == (["heard you"], "completed")
    (request,) = spoken.requests
    assert [item.body["content"][0]["text"] for item in request.context] == ["hello"]
    assert (request.audio, request.session_id) == (False, session.session["id"])
    assert "chat" not in pipeline.tasks
