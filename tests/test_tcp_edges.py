"""Switchboards over TCP: tensors go inline to a peer on another host, through shared memory to one on this host.

Both hosts here are loopback addresses (127.0.0.1 and 127.0.0.2), so nothing leaves the machine.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import torch
import trio

from omnitrio.envelopes import Payload, ToStage
from omnitrio.switchboard import Lease, Switchboard


class Sink:
    """A stage that keeps what it receives."""

    def __init__(self) -> None:
        self.got: trio.MemorySendChannel[tuple[Any, Sequence[Lease]]]
        self.got, self.received = trio.open_memory_channel(10)

    def deliver(self, envelope: ToStage, leases: Sequence[Lease] = ()) -> None:
        assert isinstance(envelope, Payload)
        self.got.send_nowait((envelope.body, leases))

    def holds(self, request_id: str, inc: int) -> bool:
        return False


PREFIX = f"omnitrio-{os.getpid()}-tcptest-"


def our_shm() -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(PREFIX)]


@asynccontextmanager
async def two_boards(host_a: str, host_b: str) -> AsyncIterator[tuple[Switchboard, Sink]]:
    """Board "a" (sending) and board "b" (with stage "s" as a Sink), connected over TCP."""
    homes = {"s": "b"}
    a, b = Switchboard("a", homes), Switchboard("b", homes)
    sink = Sink()
    b.stages["s"] = sink
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await nursery.start(b.run)
        address_a = await a.listen(f"tcp://{host_a}:*", f"{PREFIX}a-")
        address_b = await b.listen(f"tcp://{host_b}:*", f"{PREFIX}b-")
        assert address_a.startswith(f"tcp://{host_a}:") and not address_a.endswith(":*")
        a.peer_up("b", address_b)
        b.peer_up("a", address_a)
        yield a, sink
        nursery.cancel_scope.cancel()


async def test_a_tensor_to_another_host_rides_inline_over_tcp() -> None:
    tensor = torch.arange(1 << 20, dtype=torch.float32)
    async with two_boards("127.0.0.1", "127.0.0.2") as (a, sink):
        a.send(Payload("r", 0, "s", "src", {"t": tensor}))
        body, leases = await sink.received.receive()
        assert torch.equal(body["t"], tensor)
        assert leases == [] and our_shm() == []


async def test_a_tensor_to_this_host_goes_through_shared_memory() -> None:
    tensor = torch.arange(1 << 20, dtype=torch.float32)
    async with two_boards("127.0.0.1", "127.0.0.1") as (a, sink):
        a.send(Payload("r", 0, "s", "src", {"t": tensor}))
        body, leases = await sink.received.receive()
        assert torch.equal(body["t"], tensor)
        assert [owner for owner, _ in leases] == ["a"]
    assert our_shm() == []
