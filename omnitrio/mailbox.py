"""An unbounded, single-consumer queue between synchronous producers and one trio task.

The runtime makes one per request per stage and one per request at the coordinator;
a trio memory channel costs more to create than everything else a request owns, and
what is needed is smaller: ``put`` never blocks (producers are sync callbacks — the
scheduler bridge, message delivery), one task consumes, ``close`` ends the stream.

Like a memory channel, ``receive`` is a checkpoint and yields before taking an item, so
tasks draining their own mailboxes take turns: one request's backlog never delays
another's.  :meth:`Mailbox.receive_slice` takes up to ``limit`` queued items per turn
instead: a burst (a scheduler's 100 stream chunks) is handled in a few turns, so what
it produces leaves in a few batches rather than one message per pass of the loop, and
another request still waits for at most one slice.  Items come out in the order they
were put.
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

    def put(self, item: T) -> int:
        """Add ``item`` (dropped once closed); never blocks.  The number of items queued now."""
        items = self._items
        if self._closed:
            return len(items)
        items.append(item)
        if self._waiter is not None:
            self._waiter.set()
        return len(items)

    def close(self) -> None:
        """No more items; the consumer gets what is queued, then the end."""
        self._closed = True
        if self._waiter is not None:
            self._waiter.set()

    def discard(self) -> None:
        """Close, and drop what is queued: the consumer gets the end at its next receive."""
        self._items.clear()
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._items)

    async def receive(self) -> T:
        """The next item; raises ``trio.EndOfChannel`` once closed and drained.  Cancelled, it takes none."""
        if self._items:
            await trio.lowlevel.checkpoint()  # cancelled while it yielded: raises, the item stays
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
        while not self._items:
            if self._closed:
                raise trio.EndOfChannel
            self._waiter = trio.Event()
            await self._waiter.wait()
            self._waiter = None
        return self._items.popleft()

    async def receive_slice(self, limit: int) -> list[T]:
        """The next 1 to ``limit`` items (one turn); ``trio.EndOfChannel`` once closed and drained."""
        taken = [await self.receive()]
        items = self._items
        while items and len(taken) < limit:
            taken.append(items.popleft())
        return taken

    def slices(self, limit: int) -> _Slices[T]:
        """``async for items in mailbox.slices(limit)``: :meth:`receive_slice` until the end.

        The first turn takes one item, and each turn after that twice as many as the last,
        up to ``limit``: the first output leaves at once, a burst behind it in batches.
        """
        return _Slices(self, limit)

    def __aiter__(self) -> Mailbox[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None


class _Slices(Generic[T]):
    __slots__ = ("_limit", "_mailbox", "_next")

    def __init__(self, mailbox: Mailbox[T], limit: int) -> None:
        self._mailbox = mailbox
        self._limit = limit
        self._next = 1

    def __aiter__(self) -> _Slices[T]:
        return self

    async def __anext__(self) -> list[T]:
        size = self._next
        self._next = min(size * 2, self._limit)
        try:
            return await self._mailbox.receive_slice(size)
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
