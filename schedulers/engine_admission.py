"""What a continuous-batching engine checks before it queues a request, the same for every engine.

:func:`check_new_request` raises ``ValueError`` naming the request and the bad field (the
caller's mistake: the stage answers it as an ``error`` output); :func:`check_room` raises
``StageOverloaded`` when the engine's waiting queue is full.  Requests that the next step admits
into a free running slot do not count as waiting.
"""

from __future__ import annotations

from collections.abc import Sequence

from omnitrio.contract import StageOverloaded


def check_new_request(
    request_id: str,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    vocab_size: int,
    context_tokens: int,
    present: bool,
) -> None:
    """Raise ``ValueError`` unless the request is new (``present`` False) and fits the engine."""
    rid = request_id
    if present:
        raise ValueError(f"request {rid!r} is already in the engine")
    if not prompt_ids:
        raise ValueError(f"request {rid!r}: the prompt is empty")
    if any(not 0 <= t < vocab_size for t in prompt_ids):
        raise ValueError(f"request {rid!r}: prompt token ids must be in [0, {vocab_size})")
    if max_new_tokens < 1:
        raise ValueError(f"request {rid!r}: max_new_tokens={max_new_tokens} must be >= 1")
    if len(prompt_ids) + max_new_tokens > context_tokens:
        raise ValueError(
            f"request {rid!r}: prompt ({len(prompt_ids)} tokens) + max_new_tokens "
            f"({max_new_tokens}) exceeds the {context_tokens}-token context"
        )


def check_room(engine: str, request_id: str, *, waiting: int, running: int, max_running: int, max_waiting: int) -> None:
    """Raise ``StageOverloaded`` when one more waiting request would be past ``max_waiting``."""
    free = max_running - running
    if waiting >= max_waiting + free:
        raise StageOverloaded(
            f"{engine}: waiting queue is full ({waiting - free} waiting, "
            f"max_waiting_requests={max_waiting}); request {request_id!r} rejected"
        )
