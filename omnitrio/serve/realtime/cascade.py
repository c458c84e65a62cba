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

from typing import Any

from omnitrio.serve.realtime.answering import AnswerRequest, PipelineAnswering
from omnitrio.serve.realtime.conversation import messages_of
from omnitrio.serve.realtime.session_config import max_tokens
from omnitrio.serve.realtime.tools import chat_tools


class Cascade(PipelineAnswering):
    """Answers through the pipeline's ``chat`` task (see the module docstring)."""

    needs_transcripts = True

    async def ready(self, request: AnswerRequest) -> bool:
        for item in request.context:
            await item.transcribed.wait()
        return request.turn is None or bool(request.turn.heard)

    def inputs(self, request: AnswerRequest) -> dict[str, Any]:
        session = request.session
        return {
            "task": "chat",
            "messages": messages_of(request.context, session.get("instructions") or ""),
            # The responder may keep the session's conversation between turns; another context is not it.
            "session_id": request.session_id,
            "max_tokens": max_tokens(session),
            "modalities": ["text", "audio"] if request.audio else ["text"],
            "speed": session["audio"]["output"].get("speed", 1.0),
            **chat_tools(session),
        }
