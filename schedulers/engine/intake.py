"""How a scheduler that takes whole requests reads its inbox: new request, abort, refused stream input.

:class:`RequestIntake` is a :class:`~schedulers.engine.step_loop.StepLoop` whose messages mean, in
inbox order:

* ``new_request``: :meth:`RequestIntake._accept` parses the payload and queues the request in the
  engine.  Whatever it raises fails that request alone: one ``error`` output carrying the exception
  (an :class:`~omnitrio.contract.InvalidRequest` becomes the caller's 400, a
  :class:`~omnitrio.contract.StageOverloaded` a 503); the scheduler serves on.
* ``abort``: :meth:`RequestIntake._forget` drops the request wherever it is; it produces nothing more.
* ``stream_chunk`` / ``stream_done``: not accepted.  The request is forgotten and fails with a
  ``ValueError`` naming the scheduler's class, the message type and the request.
"""

from __future__ import annotations

from typing import Any

from omnitrio.contract import IncomingMessage, OutgoingMessage
from schedulers.engine.step_loop import StepLoop


class RequestIntake(StepLoop):
    """A step loop over whole requests; a subclass says how one is accepted and forgotten (module docstring)."""

    def _handle(self, message: IncomingMessage) -> None:
        rid = message.request_id
        match message.type:
            case "new_request":
                try:
                    self._accept(rid, message.data)
                except Exception as exc:  # a payload this stage cannot serve fails that request alone
                    self.emit([OutgoingMessage(rid, "error", exc)])
            case "abort":
                self._forget(rid)
            case "stream_chunk" | "stream_done":
                self._forget(rid)
                error = ValueError(f"{type(self).__name__} does not accept stream input ({message.type} for {rid!r})")
                self.emit([OutgoingMessage(rid, "error", error)])

    def _accept(self, request_id: str, data: Any) -> None:
        """Parse ``data`` and queue the request; raise to fail it (nothing of it may be kept then)."""
        raise NotImplementedError

    def _forget(self, request_id: str) -> None:
        """Drop the request wherever it is (no-op when it is not here)."""
        raise NotImplementedError
