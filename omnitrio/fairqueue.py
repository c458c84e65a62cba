"""Messages waiting for a scheduler, one FIFO per request, taken round-robin.

A scheduler takes its inbox in order.  If a stage handed it everything the moment it
arrived, one request's burst (a talker's 100 chunks) would sit in that FIFO in front of
every request that came after, and a new request's first chunk would wait for all of
it.  The scheduler bridge therefore keeps the inbox shallow and holds the rest here:
:meth:`FairQueue.take` hands out one message per request per round, and a request it
served goes to the back of the line — also across calls, so many small takes still
reach every request in turn.  A request that has one message waiting gets it through
within one round whatever the others hold.

Per request, messages come out in the order they were put.  A request's queue exists
only while it holds messages, so nothing here outlives the messages of a request.
Not thread-safe: the trio thread owns it.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    """See the module docstring."""

    __slots__ = ("_count", "_queues")

    def __init__(self) -> None:
        self._queues: dict[str, deque[T]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def put(self, key: str, item: T) -> None:
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
        queue.append(item)
        self._count += 1

    def drop(self, key: str) -> int:
        """Forget what ``key`` still holds; returns how many items that was."""
        queue = self._queues.pop(key, None)
        if queue is None:
            return 0
        self._count -= len(queue)
        return len(queue)

    @property
    def keys(self) -> int:
        """How many keys hold items: the size of one round."""
        return len(self._queues)

    def take(self, limit: int | None = None) -> list[T]:
        """Up to ``limit`` items (all when None), one per key per round.

        Keys are served in the order they were last served (new keys last); a key that
        still holds items after its turn goes to the back.
        """
        if limit is None or limit >= self._count:
            if len(self._queues) == 1:  # the common case: one request's messages, in order
                (queue,) = self._queues.values()
                self._queues.clear()
                self._count = 0
                return list(queue)
            limit = self._count
        taken: list[T] = []
        queues = self._queues
        while len(taken) < limit:
            for key in list(queues):
                queue = queues.pop(key)
                taken.append(queue.popleft())
                if queue:
                    queues[key] = queue  # to the back of the line
                if len(taken) == limit:
                    break
        self._count -= len(taken)
        return taken
