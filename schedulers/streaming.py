"""StreamingSimpleScheduler: a SimpleScheduler that also consumes stream chunks.

For stages fed by an upstream ``stream_to`` edge (vocoders, detokenizers).  A subclass
overrides the hooks; every hook runs on the scheduler thread, one at a time, so hooks
need no locks of their own.  What a subclass may rely on:

* ``is_streaming_payload(payload)`` decides per request.  A streaming payload is stored
  in ``stream_payloads[rid]`` (then ``on_streaming_new_request`` runs) and never joins a
  compute batch; a non-streaming one is computed exactly as by SimpleScheduler, and
  non-streaming requests still batch.
* Chunks reach ``on_stream_chunk(rid, item)`` as they arrive, also before the payload
  (the runtime buffers nothing).  Whatever it returns is put on the outbox at once.
* ``stream_done`` after the payload calls ``on_stream_done(rid)``: the messages it returns
  are emitted and the request's state is cleared; returning None means the subclass will
  call :meth:`~StreamingSimpleScheduler.complete_stream_request` later (from any thread).
  ``stream_done`` before the payload is remembered in ``pending_done`` and
  ``on_stream_done_before_payload(rid)``'s messages are emitted at once; when the payload
  comes, ``on_stream_done`` runs right after ``on_streaming_new_request``.
* Any exception from a hook (or a chunk that is not a ``StreamItem``) sends an ``error``
  for that request and clears its state; other requests carry on.
* Abort (and failure) clears all state of the request, ``clear_stream_state`` included;
  chunks or ``stream_done`` of that request arriving later are dropped and never
  recreate state, until the in-order ``abort`` message (or a ``new_request`` with that
  id) marks the start of a new life, which may begin with its chunks
  (:mod:`schedulers._idsets`).
* ``clear_stream_state(rid)`` runs whenever a request's life here ends (completed,
  failed, aborted; also non-streaming ones), so it must tolerate ids it holds nothing for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Literal

from omnitrio.contract import IncomingMessage, OutgoingMessage, StagePayload, StreamItem, put_messages
from schedulers._idsets import Life
from schedulers.simple import BatchComputeFn, Cleanup, ComputeFn, SimpleScheduler

logger = logging.getLogger(__name__)


class StreamingSimpleScheduler(SimpleScheduler):
    """SimpleScheduler plus per-request stream hooks (see the module docstring)."""

    def __init__(
        self,
        compute_fn: ComputeFn | None = None,
        *,
        batch_compute_fn: BatchComputeFn | None = None,
        max_batch_size: int = 1,
        max_batch_wait_ms: float = 0,
        batch_wait_when_idle: bool = True,
        request_cost_fn: Callable[[StagePayload], int] | None = None,
        max_batch_cost: int | None = None,
        abort_callback: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(
            compute_fn,
            batch_compute_fn=batch_compute_fn,
            max_batch_size=max_batch_size,
            max_batch_wait_ms=max_batch_wait_ms,
            batch_wait_when_idle=batch_wait_when_idle,
            request_cost_fn=request_cost_fn,
            max_batch_cost=max_batch_cost,
            abort_callback=abort_callback,
        )
        self.stream_payloads: dict[str, StagePayload] = {}
        self.pending_done: set[str] = set()

    # -- hooks for subclasses -------------------------------------------------------

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        return False

    def validate_non_streaming_payload(self, payload: StagePayload) -> None:
        """Raise to fail a non-streaming request before it is computed."""

    def on_streaming_new_request(self, request_id: str, payload: StagePayload) -> None:
        """The payload of a streaming request arrived (chunks may have come before it)."""

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        return []

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage] | None:
        """Messages that complete the request, or None to complete it later."""
        return []

    def on_stream_done_before_payload(self, request_id: str) -> list[OutgoingMessage]:
        """Output owed the moment the producer ends its stream, before the payload latches."""
        return []

    def clear_stream_state(self, request_id: str) -> None:
        """Drop whatever the subclass keeps for ``request_id``; see the module docstring."""

    # -- completion from the subclass -----------------------------------------------

    def complete_stream_request(self, request_id: str, messages: Iterable[OutgoingMessage]) -> None:
        """Emit ``messages`` and end the request; from any thread.  No-op once aborted."""
        life = self._ledger.live_life(request_id)
        if life is not None:
            self._complete(life, list(messages))

    # -- SimpleScheduler extension points -------------------------------------------

    def _needs_compute(self) -> bool:
        return False

    def _retires_aborted_ids(self) -> bool:
        return True

    def _accept(self, life: Life) -> Life | None:
        payload = life.payload
        try:
            streaming = self.is_streaming_payload(payload)
            if not streaming:
                self.validate_non_streaming_payload(payload)
        except Exception as exc:
            self._fail(life, exc)
            return None
        if not streaming:
            # Its compute finishes it; an early stream_done has nothing left to complete.
            self.pending_done.discard(life.request_id)
            return life
        self._guarded(life, self._start_stream, life, payload)
        return None

    def _on_stream_message(self, msg: IncomingMessage) -> None:
        match msg.type:
            case "stream_chunk":
                life = self._ledger.admit_stream(msg.request_id, is_done=False)
                if life is not None:
                    self._guarded(life, self._chunk, life, msg.data)
            case "stream_done":
                life = self._ledger.admit_stream(msg.request_id, is_done=True)
                if life is not None:
                    self._guarded(life, self._done, life)

    def _on_cleanup(self, cleanup: Cleanup) -> None:
        life = cleanup.life
        if cleanup.completed:
            self._clear_state(life.request_id)
        elif self._ledger.is_current(life):  # not yet ended by its in-order abort
            self._clear_state(life.request_id)
            self._ledger.end(life)

    def _on_life_aborted(self, life: Life) -> None:
        if self._on_scheduler_thread():
            self._clear_state(life.request_id)
            self._ledger.end(life)
        else:
            self.inbox.put(IncomingMessage(life.request_id, "abort", data=Cleanup(life, completed=False)))

    def _on_life_closed(self, life: Life) -> None:
        self._clear_state(life.request_id)

    def _final(self, life: Life, kind: Literal["result", "error"], data: Any) -> OutgoingMessage | None:
        self._clear_state(life.request_id)
        return super()._final(life, kind, data)

    # -- the stream path (scheduler thread) -----------------------------------------

    def _start_stream(self, life: Life, payload: StagePayload) -> None:
        request_id = life.request_id
        self.stream_payloads[request_id] = payload
        self.on_streaming_new_request(request_id, payload)
        if request_id in self.pending_done:
            self.pending_done.discard(request_id)
            self._stream_done(life)

    def _chunk(self, life: Life, item: object) -> None:
        if not isinstance(item, StreamItem):
            raise TypeError(
                f"stream_chunk for request {life.request_id!r} must carry a StreamItem, got {type(item).__name__}"
            )
        self._emit_now(life, self.on_stream_chunk(life.request_id, item))

    def _done(self, life: Life) -> None:
        request_id = life.request_id
        if request_id in self.stream_payloads:
            self._stream_done(life)
        elif not life.has_payload:
            self.pending_done.add(request_id)
            self._emit_now(life, self.on_stream_done_before_payload(request_id))
        # else: a non-streaming request; its compute finishes it.

    def _stream_done(self, life: Life) -> None:
        messages = self.on_stream_done(life.request_id)
        if messages is not None:
            self._complete(life, list(messages))

    def _complete(self, life: Life, messages: list[OutgoingMessage]) -> None:
        if self._on_scheduler_thread():
            self._clear_state(life.request_id)
        else:
            self.inbox.put(IncomingMessage(life.request_id, "abort", data=Cleanup(life, completed=True)))
        if self._ledger.end(life) and messages:
            put_messages(self.outbox, messages)

    def _emit_now(self, life: Life, messages: Iterable[OutgoingMessage] | None) -> None:
        outputs = list(messages or [])
        if outputs and not self._ledger.is_aborted(life):
            put_messages(self.outbox, outputs)

    def _guarded(self, life: Life, hook: Callable[..., None], *args: object) -> None:
        try:
            hook(*args)
        except Exception as exc:
            self._fail(life, exc)

    def _fail(self, life: Life, exc: Exception) -> None:
        logger.debug("%s: request %r failed", type(self).__name__, life.request_id, exc_info=exc)
        self._clear_state(life.request_id)
        if self._ledger.end(life, failed_stream=True):
            self.outbox.put(OutgoingMessage(life.request_id, "error", data=exc))

    def _clear_state(self, request_id: str) -> None:
        self.stream_payloads.pop(request_id, None)
        self.pending_done.discard(request_id)
        try:
            self.clear_stream_state(request_id)
        except Exception:
            logger.exception("%s: clear_stream_state failed for %r", type(self).__name__, request_id)


__all__ = ["StreamingSimpleScheduler"]
