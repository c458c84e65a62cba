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

:class:`EngineIntake` is the common case: a request parsed into one engine request (added to ``engine``)
and what the scheduler keeps of it until it ends (``_live``, by request id); abort drops both.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

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


class Engine(Protocol):
    """What :class:`EngineIntake` needs of an engine."""

    @property
    def has_work(self) -> bool: ...

    def add(self, request: Any, /) -> object: ...

    def abort(self, request_id: str, /) -> object: ...


E = TypeVar("E", bound=Engine)
K = TypeVar("K")


class EngineIntake(RequestIntake, Generic[E, K]):
    """Whole requests into one ``engine``, with what is kept of each in ``_live`` (module docstring); a
    subclass sets both in its constructor and says how a payload is parsed (:meth:`_parse`)."""

    engine: E
    _live: dict[str, K]

    def _has_work(self) -> bool:
        return self.engine.has_work

    def _accept(self, request_id: str, data: Any) -> None:
        request, kept = self._parse(request_id, data)
        self.engine.add(request)
        self._live[request_id] = kept

    def _forget(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self._live.pop(request_id, None)

    def _parse(self, request_id: str, data: Any) -> tuple[Any, K]:
        """The engine request ``data`` describes and what to keep of it; raise to refuse it."""
        raise NotImplementedError
