"""An unbounded, single-consumer queue between synchronous producers and one trio task.

The runtime makes one per request per stage and one per request at the coordinator;
a trio memory channel costs more to create than everything else a request owns, and
what is needed is smaller: ``put`` never blocks (producers are sync callbacks — the
scheduler bridge, message delivery), one task consumes, ``close`` ends the stream.

Like a memory channel, ``receive`` is a checkpoint and yields after taking an item, so
tasks draining their own mailboxes take turns: one request's backlog never delays
another's.  Items come out in the order they were put.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

import trio

T = TypeVar("T")


class Mailbox(Generic[T]):
    """See the module docstring."""

    __slots__ = ("_closed", "_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._waiter: trio.Event | None = None
        self._closed = False

    def put(self, item: T) -> None:
        """Add ``item`` (dropped once closed); never blocks."""
        if self._closed:
            return
        self._items.append(item)
        if self._waiter is not None:
            self._waiter.set()

    def close(self) -> None:
        """No more items; the consumer gets what is queued, then the end."""
        self._closed = True
        if self._waiter is not None:
            self._waiter.set()

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._items)

    async def receive(self) -> T:
        """The next item; raises ``trio.EndOfChannel`` once closed and drained."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._items:
            await trio.lowlevel.cancel_shielded_checkpoint()
        while not self._items:
            if self._closed:
                raise trio.EndOfChannel
            self._waiter = trio.Event()
            await self._waiter.wait()
            self._waiter = None
        return self._items.popleft()

    def __aiter__(self) -> Mailbox[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
