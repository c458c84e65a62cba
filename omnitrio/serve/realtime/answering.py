"""The pipeline that answers a turn, as the realtime session core sees it.

A response reaches the pipeline that answers it through one :class:`Answering` and nothing else:
:mod:`.response` builds an :class:`AnswerRequest` from the conversation and the session's settings,
waits for :meth:`Answering.ready`, then runs :meth:`Answering.answer`; the session waits for an
interrupted answer's release with :meth:`Answering.release`. How a pipeline answers (which task, which
inputs, whether it needs transcripts first) is the implementation's business. The cascade
(:mod:`.cascade`: the turn's transcript, a chat request, speech synthesized from the answer) is the one
implementation today; a speech-native pipeline, which hears the turn's audio and speaks itself, is another.

Server VAD (:mod:`.listen`) and input transcription (:mod:`.transcribe`) are not part of it: they
work the same whatever answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import attrs

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


class Answering(Protocol):
    """The pipeline that answers a turn."""

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
