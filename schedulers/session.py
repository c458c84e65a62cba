"""SessionScheduler: long-lived per-session state driven by ordinary requests.

A session (a realtime conversation, a streaming transcription) is a sequence of commands,
each an ordinary request at this stage whose ``payload.request.metadata["session"]`` is::

    {"op": "open",   "session_id": "s1", "config": {...}}   # config optional, for the hooks
    {"op": "append", "session_id": "s1", "chunk": <any>}     # e.g. float32 16 kHz audio
    {"op": "close",  "session_id": "s1"}                     # finish; hooks.close gives the final data
    {"op": "abort",  "session_id": "s1"}                     # drop the session's work and state

What a caller may rely on:

* Commands of one session run one at a time, in the order they reached the inbox; commands of
  different sessions run concurrently on at most ``max_concurrency`` worker threads.
* Each command ends with exactly one ``result`` (``payload.data`` is a dict
  ``{"session_id", "op", **whatever the hook returned}``) or one ``error``; ``ctx.emit``
  calls made while it runs become ``stream`` outputs of that command before its result.
* Opening a session past ``max_sessions``, or appending a chunk that would take the state
  of all sessions past ``max_state_bytes``, fails that command at once with
  :class:`~omnitrio.contract.StageOverloaded` naming the limit; the open sessions are untouched.
* ``abort(request_id)`` cancels one *command*: a queued open or append never runs, a running
  one has its remaining outputs dropped (the hook itself runs to completion), and a close or
  abort still releases the session, silently.  Other commands of the session are unaffected:
  the ``abort`` op is what ends a session early, and aborting a session that is not open (its
  ``open`` was aborted, or it is gone already) succeeds and does nothing.  After ``hooks.abort`` the scheduler
  always calls ``hooks.close`` to release resources, and discards what it returns.
* A failing ``open`` leaves no session; a failing ``append`` or ``close`` fails that command
  and leaves the session as the hook left it (``close`` failures still remove it).
* ``stop()`` aborts and closes every open session.

Requests without session metadata go to ``compute_fn(payload)`` on the same workers.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, Protocol

import attrs

from omnitrio.contract import IncomingMessage, OmniRequest, OutgoingMessage, StageOverloaded, StagePayload
from schedulers.warm_up import WarmUp

SESSION_METADATA_KEY = "session"
SessionOp = Literal["open", "append", "close", "abort"]
_OPS: frozenset[str] = frozenset({"open", "append", "close", "abort"})
_STOP = object()


@attrs.frozen
class SessionRef:
    """Names a session and the request that opened it."""

    session_id: str
    request_id: str


@attrs.frozen
class SessionCommand:
    """One parsed ``metadata["session"]`` entry."""

    op: SessionOp
    session_id: str
    chunk: Any = None
    config: dict[str, Any] = attrs.field(factory=dict)

    @classmethod
    def parse(cls, raw: Any) -> SessionCommand:
        """Validate the metadata shape; ``ValueError`` names the field that is wrong."""
        if not isinstance(raw, dict):
            raise ValueError(f"session command must be a dict, got {type(raw).__name__}")
        op, session_id = raw.get("op"), raw.get("session_id")
        if op not in _OPS:
            raise ValueError(f"session command op must be one of open, append, close, abort; got {op!r}")
        if not isinstance(session_id, str) or not session_id:
            raise ValueError(f"session command session_id must be a non-empty string, got {session_id!r}")
        if op == "append" and "chunk" not in raw:
            raise ValueError(f"session {session_id!r}: append needs a chunk")
        config = raw.get("config") or {}
        if not isinstance(config, dict):
            raise ValueError(f"session {session_id!r}: config must be a dict, got {type(config).__name__}")
        return cls(op=op, session_id=session_id, chunk=raw.get("chunk"), config=config)


class SessionHooks(Protocol):
    """What a session-backed stage computes.  Calls for one session never overlap."""

    def open(self, ref: SessionRef, request: OmniRequest) -> Any: ...

    def append(self, state: Any, chunk: Any, payload: StagePayload, ctx: SessionContext) -> dict[str, Any] | None: ...

    def abort(self, state: Any, ref: SessionRef) -> None: ...

    def close(self, state: Any) -> dict[str, Any] | None: ...

    def usage(self, state: Any) -> int: ...


def chunk_nbytes(chunk: Any) -> int:
    """Bytes a chunk will add to a session's state, as far as can be told before the hook runs."""
    match chunk:
        case bytes() | bytearray() | memoryview():
            return len(chunk)
        case str():
            return len(chunk.encode())
        case dict():
            return sum(chunk_nbytes(value) for value in chunk.values())
        case _:
            return int(getattr(chunk, "nbytes", 0))


@attrs.define(eq=False)
class _Work:
    """One command (or ordinary request) in flight; ``aborted`` is set by ``abort(request_id)``."""

    request_id: str
    payload: StagePayload
    command: SessionCommand | None
    reserved_bytes: int = 0
    aborted: bool = False


@attrs.define(eq=False)
class _Session:
    ref: SessionRef
    state: Any = None
    opened: bool = False
    usage: int = 0
    reserved: int = 0
    queue: deque[_Work] = attrs.field(factory=deque)
    running: bool = False


class SessionContext:
    """Handed to hooks while one command runs: emits ``stream`` outputs of that command."""

    def __init__(self, scheduler: SessionScheduler, work: _Work, session_id: str, pending: int) -> None:
        self._scheduler = scheduler
        self._work = work
        self.request_id = work.request_id
        self.session_id = session_id
        self.pending = pending
        """Commands of this session queued behind this one (a hook may skip optional work)."""

    def emit(self, chunk: Any, modality: str = "text") -> None:
        """Send ``chunk`` as a ``stream`` output of the current command (dropped once aborted)."""
        if self._work.aborted:
            return
        metadata = {"modality": modality, "session_id": self.session_id}
        self._scheduler.outbox.put(OutgoingMessage(self.request_id, "stream", data=chunk, metadata=metadata))


class SessionScheduler:
    """Per-session state with ordered commands; see the module docstring for the promises."""

    def __init__(
        self,
        hooks: SessionHooks,
        *,
        compute_fn: Callable[[StagePayload], Any] | None = None,
        max_sessions: int = 64,
        max_concurrency: int = 4,
        max_state_bytes: int = 1 << 30,
        warm_up: WarmUp | None = None,
    ) -> None:
        """``warm_up``: what the factory warms before the stage reports ready (:mod:`schedulers.warm_up`)."""
        for name, value in (("max_sessions", max_sessions), ("max_concurrency", max_concurrency)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(max_state_bytes, int) or max_state_bytes < 0:
            raise ValueError(f"max_state_bytes must be a non-negative integer, got {max_state_bytes!r}")
        self.hooks = hooks
        self.compute_fn = compute_fn
        self.max_sessions = max_sessions
        self.max_concurrency = max_concurrency
        self.max_state_bytes = max_state_bytes
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.outbox: queue.Queue[OutgoingMessage] = queue.Queue()
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        self._live: dict[str, _Work] = {}
        self._state_bytes = 0  # usage + reserved over all sessions
        self._pool: ThreadPoolExecutor | None = None
        self.warm_up = warm_up or WarmUp()

    # -- introspection ---------------------------------------------------------------------

    @property
    def open_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    @property
    def state_bytes(self) -> int:
        """Bytes held by all sessions, plus chunks accepted but not yet appended."""
        with self._lock:
            return self._state_bytes

    # -- StageScheduler protocol -------------------------------------------------------------

    def warm_up_serving_thread(self) -> None:
        self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="session")
        self.warm_up.run()

    @property
    def warmed(self) -> list[str]:
        """What the warm-up ran (see :mod:`schedulers.warm_up`)."""
        return self.warm_up.warmed

    def start(self) -> None:
        if self._pool is None:
            self.warm_up_serving_thread()
        try:
            while (message := self.inbox.get()) is not _STOP:
                self._dispatch(message)
        finally:
            self._shutdown()

    def stop(self) -> None:
        self.inbox.put(_STOP)

    def abort(self, request_id: str) -> None:
        """Cancel one command; also queued behind the inbox, so a request still in transit is caught."""
        self._mark_aborted(request_id)
        self.inbox.put(IncomingMessage(request_id, "abort"))

    def _mark_aborted(self, request_id: str) -> None:
        with self._lock:
            work = self._live.get(request_id)
            if work is not None:
                work.aborted = True

    # -- dispatch (scheduler thread) -----------------------------------------------------------

    def _dispatch(self, message: IncomingMessage) -> None:
        match message.type:
            case "new_request":
                self._admit(message.request_id, message.data)
            case "abort":
                self._mark_aborted(message.request_id)
            case _:
                return  # stream messages mean nothing to a session stage

    def _admit(self, request_id: str, payload: StagePayload) -> None:
        raw = payload.request.metadata.get(SESSION_METADATA_KEY) if isinstance(payload, StagePayload) else None
        if raw is None:
            self._admit_plain(request_id, payload)
            return
        try:
            command = SessionCommand.parse(raw)
            work = _Work(request_id, payload, command)
            with self._lock:
                if command.op == "abort" and command.session_id not in self._sessions:
                    session = None  # never opened, or gone already: aborting it is done
                else:
                    session = self._route(work)
                    self._live[request_id] = work
                    session.queue.append(work)
                    start = not session.running
                    session.running = True
        except Exception as exc:
            self._fail(request_id, exc)
            return
        if session is None:
            payload.data = {"session_id": command.session_id, "op": "abort"}
            self.outbox.put(OutgoingMessage(request_id, "result", data=payload))
            return
        if start:
            self._submit(session)

    def _route(self, work: _Work) -> _Session:
        """Find (or create, for open) the command's session and apply the limits.  Holds the lock."""
        command = work.command
        assert command is not None
        sid = command.session_id
        session = self._sessions.get(sid)
        match command.op:
            case "open":
                if session is not None:
                    raise ValueError(f"session {sid!r} is already open")
                if len(self._sessions) >= self.max_sessions:
                    raise StageOverloaded(f"max_sessions={self.max_sessions} reached: cannot open session {sid!r}")
                session = _Session(SessionRef(sid, work.request_id))
                self._sessions[sid] = session
                return session
            case _ if session is None:
                raise ValueError(f"session {sid!r} is not open ({command.op})")
            case "append":
                size = chunk_nbytes(command.chunk)
                if self._state_bytes + size > self.max_state_bytes:
                    raise StageOverloaded(
                        f"max_state_bytes={self.max_state_bytes} reached: sessions hold {self._state_bytes} bytes, "
                        f"a {size}-byte chunk for session {sid!r} does not fit"
                    )
                work.reserved_bytes = size
                session.reserved += size
                self._state_bytes += size
                return session
            case _:
                return session

    def _admit_plain(self, request_id: str, payload: StagePayload) -> None:
        if self.compute_fn is None:
            self._fail(request_id, ValueError(f"request has no metadata[{SESSION_METADATA_KEY!r}] session command"))
            return
        work = _Work(request_id, payload, None)
        with self._lock:
            self._live[request_id] = work
        assert self._pool is not None
        self._pool.submit(self._run_plain, work)

    def _submit(self, session: _Session) -> None:
        assert self._pool is not None
        self._pool.submit(self._run_next, session)

    # -- workers ---------------------------------------------------------------------------

    def _run_plain(self, work: _Work) -> None:
        assert self.compute_fn is not None
        if work.aborted:
            self._live_done(work)
            return
        try:
            result = self.compute_fn(work.payload)
        except Exception as exc:
            self._finish(work, OutgoingMessage(work.request_id, "error", data=exc))
            return
        self._finish(work, OutgoingMessage(work.request_id, "result", data=result))

    def _run_next(self, session: _Session) -> None:
        """Run the session's next command, then hand the session back to the pool if more wait."""
        with self._lock:
            work = session.queue.popleft()
            pending = len(session.queue)
        command = work.command
        assert command is not None
        try:
            # An aborted close/abort still runs: it releases the session, only its outputs are dropped.
            if not work.aborted or command.op in ("close", "abort"):
                self._run_command(session, work, pending)
        finally:
            if command.op == "open" and not session.opened:
                self._forget(session)
            with self._lock:
                self._release_reservation(session, work)
                again = bool(session.queue)
                session.running = again
            self._live_done(work)
        if again:
            self._submit(session)

    def _run_command(self, session: _Session, work: _Work, pending: int) -> None:
        command = work.command
        assert command is not None
        ctx = SessionContext(self, work, command.session_id, pending)
        try:
            data = self._apply(session, work, command, ctx)
        except Exception as exc:
            self._send(work, OutgoingMessage(work.request_id, "error", data=exc))
            return
        work.payload.data = {"session_id": command.session_id, "op": command.op, **(data or {})}
        self._send(work, OutgoingMessage(work.request_id, "result", data=work.payload))

    def _apply(
        self, session: _Session, work: _Work, command: SessionCommand, ctx: SessionContext
    ) -> dict[str, Any] | None:
        match command.op:
            case "open":
                try:
                    session.state = self.hooks.open(session.ref, work.payload.request)
                except BaseException:
                    self._forget(session)
                    raise
                session.opened = True
                self._account(session)
                return None
            case "abort" if not session.opened:
                return None  # its open was aborted before it ran: nothing to release
            case _ if not session.opened:
                raise ValueError(f"session {command.session_id!r} is not open ({command.op})")
            case "append":
                data = self.hooks.append(session.state, command.chunk, work.payload, ctx)
                with self._lock:
                    self._release_reservation(session, work)
                if self._account(session) > self.max_state_bytes:
                    self._end(session, aborted=True)
                    raise StageOverloaded(
                        f"max_state_bytes={self.max_state_bytes} exceeded after append; "
                        f"session {command.session_id!r} aborted"
                    )
                return data
            case "close":
                try:  # the hook's return value is the final data of the session
                    return self.hooks.close(session.state)
                finally:
                    self._forget(session)
            case "abort":
                self._end(session, aborted=True)
                return None
        raise AssertionError(command.op)

    def _end(self, session: _Session, *, aborted: bool) -> None:
        """Abort (optionally) and close a session, then forget it, whatever the hooks raise."""
        try:
            if aborted:
                self.hooks.abort(session.state, session.ref)
        finally:
            try:
                self.hooks.close(session.state)
            finally:
                self._forget(session)

    # -- bookkeeping (any thread) -----------------------------------------------------------

    def _account(self, session: _Session) -> int:
        usage = int(self.hooks.usage(session.state))
        with self._lock:
            self._state_bytes += usage - session.usage
            session.usage = usage
            return self._state_bytes

    def _release_reservation(self, session: _Session, work: _Work) -> None:
        """Holds the lock.  A chunk's reservation ends when its append ran (or never will)."""
        session.reserved -= work.reserved_bytes
        self._state_bytes -= work.reserved_bytes
        work.reserved_bytes = 0

    def _forget(self, session: _Session) -> None:
        with self._lock:
            if self._sessions.get(session.ref.session_id) is session:
                del self._sessions[session.ref.session_id]
            self._state_bytes -= session.usage
            session.usage = 0
            session.opened = False

    def _live_done(self, work: _Work) -> None:
        with self._lock:
            if self._live.get(work.request_id) is work:
                del self._live[work.request_id]

    def _send(self, work: _Work, message: OutgoingMessage) -> None:
        if not work.aborted:
            self.outbox.put(message)

    def _finish(self, work: _Work, message: OutgoingMessage) -> None:
        self._send(work, message)
        self._live_done(work)

    def _fail(self, request_id: str, exc: BaseException) -> None:
        self.outbox.put(OutgoingMessage(request_id, "error", data=exc))

    def _shutdown(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            if session.opened:
                try:
                    self._end(session, aborted=True)
                except Exception:
                    continue  # shutting down: one session's failure must not keep the others' state alive
            self._forget(session)
