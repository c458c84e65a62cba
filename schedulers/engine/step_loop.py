"""The loop every stepping scheduler runs: block while idle, otherwise take every queued message, then step.

A :class:`StepLoop` owns an unbounded ``inbox`` (the IO side never blocks) and an ``outbox``.  Each
turn of :meth:`StepLoop.start`:

1. when there is no work, puts what is pending on the outbox and blocks for the next message;
2. handles every message queued so far, in the order they were queued (``abort`` travels through
   the inbox too, so it is handled in order with the request's other messages);
3. runs one step if there is work;
4. puts everything the turn produced (message handling and step together) on the outbox at once:
   one wake-up of the IO side per turn, never one per message.

:meth:`StepLoop.stop` makes ``start`` return at the next message it takes (a turn's step and its
outputs go out first only when the turn got that far).  :meth:`StepLoop.abort` is safe from any
thread and never blocks.  What a message means is the subclass's business (:meth:`_handle`); a
scheduler that takes whole requests uses :class:`~schedulers.engine.intake.RequestIntake`.

A factory may give the loop a :class:`~schedulers.warm_up.WarmUp` (``warm_up``): it runs on the serving
thread before the stage reports ready, and its steps may :meth:`StepLoop.rehearse` requests — serve them
to completion on that thread, through the same message handling and steps a real request takes, their
outputs returned instead of sent.
"""

from __future__ import annotations

import queue
from collections.abc import Iterable
from typing import Final

from omnitrio.contract import IncomingMessage, OutgoingMessage, put_messages
from schedulers.warm_up import WarmUp


class Stop:
    """Inbox sentinel: ``start()`` returns when it reaches it."""


STOP: Final = Stop()


class Mailboxes:
    """A scheduler's two unbounded queues, what the runtime reads as its ``inbox`` (messages, then
    :data:`STOP`) and ``outbox`` (its outgoing messages); the scheduler's thread owns what it takes."""

    def __init__(self) -> None:
        self._inbox: queue.Queue[IncomingMessage | Stop] = queue.Queue()
        self._outbox: queue.Queue[OutgoingMessage] = queue.Queue()

    @property
    def inbox(self) -> queue.Queue[IncomingMessage | Stop]:
        return self._inbox

    @property
    def outbox(self) -> queue.Queue[OutgoingMessage]:
        return self._outbox


class StepLoop(Mailboxes):
    """Base of a stepping scheduler: a subclass says what work is, how a message is handled, what a step does."""

    def __init__(self) -> None:
        super().__init__()
        self._pending: list[OutgoingMessage] = []
        self.warm_up = WarmUp()
        """Run before the stage reports ready (module docstring); a factory adds its steps."""

    def warm_up_serving_thread(self) -> None:
        """Keep torch to one intra-op thread per scheduler (oversubscribed cores stall OpenMP), then run
        :attr:`warm_up`."""
        import torch

        torch.set_num_threads(1)
        self.warm_up.run()

    @property
    def warmed(self) -> list[str]:
        """What the warm-up ran (see :mod:`schedulers.warm_up`)."""
        return self.warm_up.warmed

    def rehearse(self, messages: Iterable[IncomingMessage]) -> list[OutgoingMessage]:
        """Handle ``messages`` in order, then step until there is no work; return every output (none reaches
        the outbox).  Serving thread only, before :meth:`start`."""
        for message in messages:
            self._handle(message)
        while self._has_work():
            self.emit(self._step())
        outputs, self._pending = self._pending, []
        return outputs

    def start(self) -> None:
        """Serve until :meth:`stop` (module docstring)."""
        while True:
            if not self._has_work():
                self._flush()
                first = self._inbox.get()
                if isinstance(first, Stop):
                    return
                self._handle(first)
            while True:
                try:
                    message = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if isinstance(message, Stop):
                    self._flush()
                    return
                self._handle(message)
            if self._has_work():
                self.emit(self._step())
            self._flush()

    def stop(self) -> None:
        self._inbox.put(STOP)

    def abort(self, request_id: str) -> None:
        """Non-blocking, from any thread; the request stops before the next step."""
        self._inbox.put(IncomingMessage(request_id, "abort"))

    def emit(self, messages: Iterable[OutgoingMessage]) -> None:
        """Queue outputs; they reach the outbox together at the end of this turn (scheduler thread only)."""
        self._pending.extend(messages)

    def _flush(self) -> None:
        if self._pending:
            put_messages(self._outbox, self._pending)
            self._pending = []

    # -- what a subclass defines --------------------------------------------------------

    def _has_work(self) -> bool:
        raise NotImplementedError

    def _handle(self, message: IncomingMessage) -> None:
        raise NotImplementedError

    def _step(self) -> list[OutgoingMessage]:
        raise NotImplementedError
