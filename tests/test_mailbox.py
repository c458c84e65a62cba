"""The per-request mailbox: order, end of stream, and consumers taking turns."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from omnitrio.mailbox import Mailbox


@asynccontextmanager
async def consuming(box: Mailbox[str]) -> AsyncIterator[list[str]]:
    """A task collecting every item ``box`` yields into the list given, already waiting on it; leaving the
    block waits for the task to end."""
    got: list[str] = []

    async def consume() -> None:
        async for item in box:
            got.append(item)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume)
        await trio.testing.wait_all_tasks_blocked()
        yield got


async def test_items_come_out_in_order_then_the_end() -> None:
    box: Mailbox[int] = Mailbox()
    for i in range(5):
        box.put(i)
    box.close()
    box.put(99)  # after close: dropped
    assert [i async for i in box] == [0, 1, 2, 3, 4]
    with pytest.raises(trio.EndOfChannel):
        await box.receive()


async def test_a_waiting_consumer_wakes_on_put_and_on_close() -> None:
    box: Mailbox[str] = Mailbox()
    async with consuming(box) as got:
        box.put("a")
        await trio.testing.wait_all_tasks_blocked()
        assert got == ["a"]
        box.close()
    assert got == ["a"]


async def test_consumers_with_backlogs_take_turns() -> None:
    boxes: list[Mailbox[int]] = [Mailbox(), Mailbox()]
    for box in boxes:
        for i in range(3):
            box.put(i)
        box.close()
    order: list[tuple[int, int]] = []

    async def consume(n: int) -> None:
        async for item in boxes[n]:
            order.append((n, item))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume, 0)
        nursery.start_soon(consume, 1)
    # Each pass of the loop runs both consumers once (trio may run them in either order):
    # every pair of consecutive items holds one from each mailbox.
    assert [sorted(n for n, _ in order[k : k + 2]) for k in range(0, 6, 2)] == [[0, 1]] * 3


async def test_a_cancelled_receive_takes_nothing() -> None:
    box: Mailbox[int] = Mailbox()
    box.put(1)
    with trio.CancelScope() as scope:
        scope.cancel()
        await box.receive()
    assert len(box) == 1


async def test_a_consumer_woken_for_an_item_gets_only_the_end_once_the_box_is_discarded() -> None:
    box: Mailbox[str] = Mailbox()
    async with consuming(box) as got:
        box.put("a")  # wakes the consumer ...
        box.discard()  # ... which has not run yet: it must not get "a"
        box.put("b")
    assert got == []
    assert len(box) == 0
