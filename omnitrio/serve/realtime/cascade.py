"""The cascade answers a turn: ASR's transcript of it, a chat request, speech synthesized from the answer.

:class:`Cascade` is the :class:`~.answering.Answering` of a pipeline that serves the ``chat`` task
(the voice pipeline: an LLM then a TTS stage; text-only pipelines too). It answers once every item
of the context has its transcript (:mod:`.transcribe`), with one pipeline request, task ``chat``: the
context as messages (:func:`~.conversation.messages_of`), the session's ``instructions``,
``max_tokens``, ``tools`` and ``tool_choice`` in the chat shape, the output modalities and speed, and
the ``session_id`` when it answers the session's own conversation. A turn whose transcript heard
nothing (noise, a cough) is not answered.
"""

from __future__ import annotations

from collections.abc import Callable

from omnitrio.serve.context import ServeContext
from omnitrio.serve.output import Delta, Output
from omnitrio.serve.realtime.answering import AnswerRequest
from omnitrio.serve.realtime.conversation import messages_of
from omnitrio.serve.realtime.settings import max_tokens
from omnitrio.serve.realtime.tools import chat_tools


class Cascade:
    """Answers through the pipeline's ``chat`` task (see the module docstring)."""

    def __init__(self, ctx: ServeContext) -> None:
        self.ctx = ctx

    async def ready(self, request: AnswerRequest) -> bool:
        for item in request.context:
            await item.transcribed.wait()
        return request.turn is None or bool(request.turn.heard)

    async def answer(self, request: AnswerRequest, output: Output, send: Callable[[Delta], None]) -> None:
        session = request.session
        inputs = {
            "task": "chat",
            "messages": messages_of(request.context, session.get("instructions") or ""),
            # The responder may keep the session's conversation between turns; another context is not it.
            "session_id": request.session_id,
            "max_tokens": max_tokens(session),
            "modalities": ["text", "audio"] if request.audio else ["text"],
            "speed": session["audio"]["output"].get("speed", 1.0),
            **chat_tools(session),
        }
        async with self.ctx.pipeline.stream(request.request_id, inputs, timeout=self.ctx.request_timeout) as messages:
            async for message in messages:
                for delta in output.add(message):
                    send(delta)
        for delta in output.finish():
            send(delta)

    async def release(self, request_id: str) -> None:
        await self.ctx.pipeline.abort(request_id, wait=True)
