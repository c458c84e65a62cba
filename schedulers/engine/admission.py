"""What every engine checks before it queues a request: the prompt, the context, the answer's budget, room.

The caller's mistakes raise :class:`~omnitrio.contract.InvalidRequest` with OpenAI's ``code`` and
``param`` (the stage answers it as an ``error`` output and the caller gets a 400):

* an empty prompt, or a token id outside the vocabulary: ``invalid_value`` on ``messages``;
* ``max_tokens`` below 1: ``invalid_value`` on ``max_tokens``;
* a prompt plus the answer's budget past the model's context: ``context_length_exceeded`` on
  ``messages``, in OpenAI's words ("This model's maximum context length is N tokens. However, you
  requested ...").

A full waiting queue raises :class:`~omnitrio.contract.StageOverloaded` (a 503): requests that the
next step admits into a free running place do not count as waiting.  A request id already in the
engine is a ``ValueError`` (the runtime's mistake, not the caller's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import attrs

from omnitrio.contract import InvalidRequest, StageOverloaded

FinishReason = Literal["stop", "length"]
"""Why an answer ended, as OpenAI names it: its end token (``stop``) or its token budget (``length``)."""


def context_length_exceeded(context: int, prompt_tokens: int, completion_tokens: int) -> InvalidRequest:
    """OpenAI's error for a request of ``prompt_tokens + completion_tokens`` against a ``context``-token model."""
    return InvalidRequest(
        f"This model's maximum context length is {context} tokens. However, you requested "
        f"{prompt_tokens + completion_tokens} tokens ({prompt_tokens} in the messages, {completion_tokens} in "
        "the completion). Please reduce the length of the messages or the completion.",
        code="context_length_exceeded",
        param="messages",
    )


def completion_budget(
    prompt_tokens: int, asked: int | None, *, context: int, default: int, cap: int | None = None
) -> int:
    """How many tokens the answer may have.

    ``asked`` (the request's ``max_tokens``), at most ``cap``, must fit beside the prompt; when the request
    does not ask, the budget is ``default`` (at most ``cap``) or what the context leaves, whichever is less.
    Raises ``InvalidRequest`` for ``asked < 1`` and when the prompt leaves no room for the budget."""
    if asked is not None and asked < 1:
        raise InvalidRequest(f"max_tokens={asked} must be >= 1", param="max_tokens")
    limit = default if asked is None else asked
    if cap is not None:
        limit = min(limit, cap)
    room = context - prompt_tokens
    budget = limit if asked is not None else min(limit, room)
    if budget < 1 or prompt_tokens + budget > context:
        raise context_length_exceeded(context, prompt_tokens, max(budget, 1))
    return budget


@attrs.frozen
class Admission:
    """One engine's limits: ``engine`` names it in errors; ``vocab_size`` None skips the token-id check."""

    engine: str
    context_tokens: int
    max_running: int
    max_waiting: int
    vocab_size: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.max_running < 1 or self.max_waiting < 0 or self.context_tokens < 2:
            raise ValueError(
                f"{self.engine}: max_running={self.max_running} must be >= 1, max_waiting={self.max_waiting} >= 0, "
                f"context={self.context_tokens} >= 2"
            )

    def check(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        *,
        present: bool,
        waiting: int,
        running: int,
    ) -> None:
        """Raise unless a new request (``present`` False) fits: the module docstring's errors, in that order."""
        rid = request_id
        if present:
            raise ValueError(f"{self.engine}: request {rid!r} is already in the engine")
        if not len(prompt_ids):
            raise InvalidRequest(f"{self.engine}: request {rid!r}: the prompt is empty", param="messages")
        vocab = self.vocab_size
        if vocab is not None and any(not 0 <= t < vocab for t in prompt_ids):
            raise InvalidRequest(
                f"{self.engine}: request {rid!r}: prompt token ids must be in [0, {vocab})", param="messages"
            )
        if max_new_tokens < 1:
            raise InvalidRequest(
                f"{self.engine}: request {rid!r}: max_new_tokens={max_new_tokens} must be >= 1", param="max_tokens"
            )
        if len(prompt_ids) + max_new_tokens > self.context_tokens:
            raise context_length_exceeded(self.context_tokens, len(prompt_ids), max_new_tokens)
        self.check_room(rid, waiting=waiting, running=running)

    def check_room(self, request_id: str, *, waiting: int, running: int) -> None:
        """Raise ``StageOverloaded`` when one more waiting request would be past ``max_waiting``."""
        free = max(self.max_running - running, 0)
        if waiting >= self.max_waiting + free:
            raise StageOverloaded(
                f"{self.engine}: waiting queue is full ({waiting - free} waiting, "
                f"max_waiting_requests={self.max_waiting}); request {request_id!r} rejected"
            )
