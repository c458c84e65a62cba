"""A scheduler written by hand over the stage protocol, for toy stages that need none of the kit's machinery.

:class:`HandScheduler` holds the protocol's ``inbox`` and ``outbox`` queues; ``start`` hands each
``new_request`` message to :meth:`~HandScheduler.on_request`, one at a time on the serving thread, and
ignores every other message until ``stop`` puts None in the inbox; ``abort`` and the warm-up do nothing.
A subclass writes :meth:`~HandScheduler.on_request` and overrides whatever else it does differently.
"""

from __future__ import annotations

import queue

from omnitrio.contract import IncomingMessage, OutgoingMessage


class HandScheduler:
    """The stage protocol by hand (module docstring); ``outbox_size`` bounds the outbox (0: unbounded)."""

    def __init__(self, outbox_size: int = 0) -> None:
        self.inbox: queue.Queue[IncomingMessage | None] = queue.Queue()
        self.outbox: queue.Queue[OutgoingMessage] = queue.Queue(maxsize=outbox_size)

    def warm_up_serving_thread(self) -> None:
        return

    def start(self) -> None:
        while (msg := self.inbox.get()) is not None:
            if msg.type == "new_request":
                self.on_request(msg)

    def on_request(self, msg: IncomingMessage) -> None:
        """One new request (its ``data`` is the :class:`~omnitrio.contract.StagePayload`); the default answers
        nothing."""

    def stop(self) -> None:
        self.inbox.put(None)

    def abort(self, request_id: str) -> None:
        return


__all__ = ["HandScheduler"]
