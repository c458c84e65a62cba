"""Request-id bookkeeping shared by the scheduler families: who is live, who was aborted.

A scheduler sees one request id go through *lives*: a life starts when the scheduler
thread consumes the first message of that id (``new_request``, or a stream message at a
streaming stage) and ends when its result or error is emitted, or when it is aborted.
The runtime promises not to reuse an id until its previous life is released, so an id
can have at most one live life here.

:class:`RequestLedger` is the one place that decides, under one short lock, whether an
output may still be emitted and whether an incoming message belongs to an aborted life.
The rules:

* ``abort(rid)`` (:meth:`RequestLedger.abort`, from any thread, out of order) of a **live**
  request marks it aborted: its outputs are dropped, even a result computed after the
  abort, and stream messages that follow it in the inbox belong to it and are dropped.
* ``abort(rid)`` for an id whose ``new_request`` is still **queued** in the inbox, or that
  this scheduler has **never seen**, is remembered (a *drop mark*): the next ``new_request``
  with that id, and stream messages before it, are dropped; that ``new_request`` clears the
  mark.  This is "abort before arrival".
* ``abort(rid)`` for an id whose last life **already ended** is ignored: the runtime drops
  outputs of inactive requests anyway, and remembering it would silently swallow the
  id's next legitimate life.
* Streaming schedulers *retire* ids whose life ended by abort or failure: stream messages
  for a retired id are dropped (late chunks never recreate state).
* An ``abort`` message taken from the inbox (:meth:`RequestLedger.close_in_order`) is the
  **boundary** between two lives: whatever of the old life reached this scheduler came
  before it, and whatever follows it belongs to a new life.  It ends the live life (if
  any) and clears every mark of the id, so a new life that begins with stream data (a
  stage that accepts stream data before its payload) is not mistaken for the old one.
  A runtime that never sends abort messages still gets a fresh life from the next
  ``new_request``.

All memory of ended ids is bounded (:data:`ID_MEMORY`, oldest forgotten first).
"""

from __future__ import annotations

import enum
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import attrs

V = TypeVar("V")

ID_MEMORY = 10_000
"""How many ended or marked request ids a scheduler remembers."""


class RecentIds(Generic[V]):
    """A bounded insertion-ordered map from request id to ``V``; the oldest entries go first.

    Not thread-safe: the owner serialises access (the ledger holds its lock).
    """

    def __init__(self, capacity: int = ID_MEMORY) -> None:
        if capacity < 1:
            raise ValueError(f"RecentIds capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._items: OrderedDict[str, V] = OrderedDict()

    def put(self, request_id: str, value: V) -> None:
        self._items.pop(request_id, None)
        self._items[request_id] = value
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, request_id: str) -> V | None:
        return self._items.get(request_id)

    def pop(self, request_id: str) -> V | None:
        return self._items.pop(request_id, None)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._items

    def __len__(self) -> int:
        return len(self._items)


class Mark(enum.Enum):
    """What the ledger remembers about an id that is not live."""

    DROP_NEXT = "drop-next"
    """Aborted before its ``new_request`` was consumed: drop that ``new_request``."""
    RETIRED = "retired"
    """Life ended by abort/failure at a streaming stage: drop stream messages until the boundary."""


@attrs.define(eq=False)
class Life:
    """One life of a request id at this scheduler.

    ``payload`` is set (and ``has_payload``) once its ``new_request`` has been consumed; ``aborted`` is set by
    :meth:`RequestLedger.abort` from any thread and read under the ledger's lock.
    """

    request_id: str
    payload: Any = None
    has_payload: bool = False
    aborted: bool = False


@attrs.frozen
class Boundary:
    """What an in-order ``abort`` message ended: the live ``life`` (or None), and whether
    that abort is the one that aborted it (no out-of-order ``abort()`` came first)."""

    life: Life | None
    newly_aborted: bool


class Admission(enum.Enum):
    """Why :meth:`RequestLedger.admit_payload` refused a ``new_request``."""

    DROPPED = "dropped"
    DUPLICATE = "duplicate"


class RequestLedger:
    """Thread-safe record of live lives, drop marks and recently ended ids.

    ``is_queued(rid)`` tells whether a ``new_request`` for ``rid`` is still waiting in the
    scheduler's inbox; it is called with the ledger's lock held and must not take it.
    ``retire_on_abort`` is True for streaming schedulers (see the module docstring).
    """

    def __init__(self, is_queued: Callable[[str], bool], *, retire_on_abort: bool = False) -> None:
        self._lock = threading.Lock()
        self._is_queued = is_queued
        self._retire_on_abort = retire_on_abort
        self._live: dict[str, Life] = {}
        self._marks: RecentIds[Mark] = RecentIds()
        self._ended: RecentIds[None] = RecentIds()

    # -- scheduler thread: messages coming in ---------------------------------------

    def admit_payload(self, request_id: str, payload: Any) -> Life | Admission:
        """A ``new_request`` was consumed: its life, or why it must not run."""
        with self._lock:
            mark = self._marks.pop(request_id)
            life = self._live.get(request_id)
            if mark is Mark.DROP_NEXT:
                self._ended.put(request_id, None)
                return Admission.DROPPED
            if life is None or life.aborted:
                # An aborted life may still be finishing its compute; the runtime only
                # sends a new_request after it released the old one, so this is a new
                # life.  The old one's outputs are dropped by identity in end().
                life = self._live[request_id] = Life(request_id)
            elif life.has_payload:
                return Admission.DUPLICATE
            self._ended.pop(request_id)
            life.payload = payload
            life.has_payload = True
            return life

    def admit_stream(self, request_id: str, *, is_done: bool) -> Life | None:
        """A stream message was consumed: the life it belongs to, or None to drop it.

        Stream messages for aborted, retired or drop-marked ids are dropped.  A
        ``stream_done`` for an id whose life completed is late (it raced the result) and
        dropped too; a chunk for such an id starts a new life (stream-before-payload of a
        reused id).
        """
        with self._lock:
            if request_id in self._marks:
                return None
            life = self._live.get(request_id)
            if life is not None:
                return None if life.aborted else life
            if is_done and request_id in self._ended:
                return None
            self._ended.pop(request_id)
            life = self._live[request_id] = Life(request_id)
            return life

    # -- any thread: ending lives ---------------------------------------------------

    def is_aborted(self, life: Life) -> bool:
        with self._lock:
            return life.aborted

    def live_life(self, request_id: str) -> Life | None:
        """The live, not aborted life of ``request_id``, if any."""
        with self._lock:
            life = self._live.get(request_id)
            return None if life is None or life.aborted else life

    def end(self, life: Life, *, failed_stream: bool = False) -> bool:
        """End ``life``; True when its final output may be emitted (it was not aborted).

        Idempotent: ending a life twice returns False the second time.  ``failed_stream``
        retires the id at a streaming stage (late chunks of the failed life are dropped).
        """
        with self._lock:
            if self._live.get(life.request_id) is not life:
                return False
            del self._live[life.request_id]
            if self._retire_on_abort and (life.aborted or failed_stream):
                self._marks.put(life.request_id, Mark.RETIRED)
            else:
                self._ended.put(life.request_id, None)
            return not life.aborted

    def is_current(self, life: Life) -> bool:
        """Whether ``life`` is still the live life of its id (not yet ended)."""
        with self._lock:
            return self._live.get(life.request_id) is life

    def abort(self, request_id: str) -> Life | bool:
        """Apply an out-of-order abort (any thread); see the module docstring for the rules.

        Returns the live life it aborted (the caller cleans up its state), True when it
        left a drop mark, False when there was nothing to do (already aborted or ended).
        """
        with self._lock:
            life = self._live.get(request_id)
            if life is not None:
                if life.aborted:
                    return False
                life.aborted = True
                return life
            mark = self._marks.get(request_id)
            if mark is Mark.DROP_NEXT:
                return False
            if self._is_queued(request_id) or (mark is None and request_id not in self._ended):
                self._marks.put(request_id, Mark.DROP_NEXT)
                return True
            return False

    def close_in_order(self, request_id: str) -> Boundary:
        """An ``abort`` message was consumed (scheduler thread): end the id's life here.

        What follows in the inbox starts a new life.  The returned :class:`Boundary` holds
        the life it ended, if one was live (the caller clears that life's state).
        """
        with self._lock:
            self._marks.pop(request_id)
            self._ended.pop(request_id)
            life = self._live.pop(request_id, None)
            if life is None:
                return Boundary(None, newly_aborted=False)
            newly_aborted = not life.aborted
            life.aborted = True
            return Boundary(life, newly_aborted=newly_aborted)
