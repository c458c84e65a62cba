"""The pipeline that answers a turn, as the realtime session core sees it.

A response reaches the pipeline that answers it through one :class:`Answering` and nothing else:
:mod:`.response` builds an :class:`AnswerRequest` from the conversation and the session's settings,
waits for :meth:`Answering.ready`, then runs :meth:`Answering.answer`; the session waits for an
interrupted answer's release with :meth:`Answering.release`. How a pipeline answers (which task, which
inputs, whether it needs transcripts first) is the implementation's business. Two implement it: the
cascade (:mod:`.cascade`: the turn's transcript, a chat request, speech synthesized from the answer) and
a speech-native pipeline (:mod:`.speech_native`: the model hears the turn's audio and speaks itself).
The pipeline's config names which one its realtime sessions use (``PipelineConfig.realtime_answer``,
:data:`ANSWERINGS` in :mod:`.session`).

Server VAD (:mod:`.listen`) and input transcription (:mod:`.transcribe`) are not part of it: they
work the same whatever answers; only whether every committed item must be transcribed for the answer
(:attr:`Answering.needs_transcripts`) differs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import attrs

from omnitrio.serve.context import ServeContext
from omnitrio.serve.output import Delta, Output
from omnitrio.serve.realtime.conversation import Item


@attrs.frozen
class AnswerRequest:
    """What one response asks of the pipeline that answers."""

    request_id: str  # the pipeline request that answers (aborting it ends the answer at every stage)
    session: dict[str, Any]  # the session's settings for this response: instructions, tools, voice, limits
    context: list[Item]  # what the answer follows, oldest first; the turn it answers, if any, is last
    turn: Item | None  # the user audio turn it answers, if any
    session_id: str | None  # the session whose own conversation it answers (a pipeline may keep it), else None
    audio: bool  # answer with audio (else text only)
    voice: Any = "default"  # the voice name the client asked for (the session's settings read it back as played)


class Answering(Protocol):
    """The pipeline that answers a turn."""

    needs_transcripts: bool
    """Whether every committed user audio item must be transcribed before it can be answered (else
    items are transcribed only when the client asks for input transcription)."""

    async def ready(self, request: AnswerRequest) -> bool:
        """Return once ``request`` can be answered: True, or False when there is nothing to answer (the
        turn said nothing), in which case the answer is empty and :meth:`answer` is not called."""
        ...

    async def answer(self, request: AnswerRequest, output: Output, send: Callable[[Delta], None]) -> None:
        """Run the answer: every message the pipeline streams goes through ``output``, and each delta
        ``output`` gives (then those of :meth:`Output.finish`) to ``send``, in order. Returns when the
        answer is complete; raises what failed. Cancelled, it aborts the request at every stage."""
        ...

    async def release(self, request_id: str) -> None:
        """Abort ``request_id`` if it still runs, and return once every stage has let it go."""
        ...


class PipelineAnswering:
    """An :class:`Answering` that answers with one streamed pipeline request, whose inputs a subclass
    builds (:meth:`inputs`); aborting that request ends the answer at every stage."""

    needs_transcripts = False

    def __init__(self, ctx: ServeContext) -> None:
        self.ctx = ctx

    def inputs(self, request: AnswerRequest) -> dict[str, Any]:
        """The pipeline inputs that answer ``request``."""
        raise NotImplementedError

    async def ready(self, request: AnswerRequest) -> bool:
        return True

    async def answer(self, request: AnswerRequest, output: Output, send: Callable[[Delta], None]) -> None:
        inputs = self.inputs(request)
        async with self.ctx.pipeline.stream(request.request_id, inputs, timeout=self.ctx.request_timeout) as messages:
            async for message in messages:
                for delta in output.add(message):
                    send(delta)
        for delta in output.finish():
            send(delta)

    async def release(self, request_id: str) -> None:
        await self.ctx.pipeline.abort(request_id, wait=True)
