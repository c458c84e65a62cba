"""The loop the AR schedulers share: block while idle, otherwise take every queued message, then step.

A :class:`StepLoop` owns an unbounded ``inbox`` (the IO side never blocks) and an ``outbox``.
Each turn of :meth:`StepLoop.start` handles every message queued so far, in order, then runs
one step if there is work; a step's outputs go to the outbox together (one wake-up of the
IO side per step).  ``abort`` goes through the inbox, so it is handled in order with the
request's other messages; ``stop`` makes ``start`` return at the next turn.  Stream input is
refused: the request fails with an error naming the scheduler.
"""

from __future__ import annotations

import queue
from typing import Final

import torch

from omnitrio.contract import IncomingMessage, OutgoingMessage, put_messages


class _Stop:
    """Inbox sentinel: ``start()`` returns when it reaches it."""


STOP: Final = _Stop()


class StepLoop:
    """Base of a stepping scheduler: subclasses say what work is, how a message is handled and what a step does."""

    def __init__(self) -> None:
        self._inbox: queue.Queue[IncomingMessage | _Stop] = queue.Queue()
        self._outbox: queue.Queue[OutgoingMessage] = queue.Queue()

    @property
    def inbox(self) -> queue.Queue[IncomingMessage | _Stop]:
        return self._inbox

    @property
    def outbox(self) -> queue.Queue[OutgoingMessage]:
        return self._outbox

    def warm_up_serving_thread(self) -> None:
        """Keep torch to one intra-op thread per scheduler (oversubscribed cores stall OpenMP)."""
        torch.set_num_threads(1)

    def start(self) -> None:
        """Serve until :meth:`stop`: block while idle, otherwise take every queued message, then step."""
        while True:
            if not self._has_work():
                first = self._inbox.get()
                if isinstance(first, _Stop):
                    return
                self._handle(first)
            while True:
                try:
                    message = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if isinstance(message, _Stop):
                    return
                self._handle(message)
            if self._has_work():
                put_messages(self._outbox, self._step())

    def stop(self) -> None:
        self._inbox.put(STOP)

    def abort(self, request_id: str) -> None:
        """Non-blocking; the request stops before the next step."""
        self._inbox.put(IncomingMessage(request_id, "abort"))

    def _refuse_stream(self, message: IncomingMessage) -> None:
        """Fail a request that was sent stream input (call after dropping its state)."""
        kind, rid = message.type, message.request_id
        error = ValueError(f"{type(self).__name__} does not accept stream input ({kind} for {rid!r})")
        self._outbox.put(OutgoingMessage(rid, "error", error))

    # -- what a subclass defines --------------------------------------------------------

    def _has_work(self) -> bool:
        raise NotImplementedError

    def _handle(self, message: IncomingMessage) -> None:
        raise NotImplementedError

    def _step(self) -> list[OutgoingMessage]:
        raise NotImplementedError
