"""Switchboards over TCP: tensors go as zmq frames of their own to a peer on another host, through shared
memory to one on this host; a peer that goes away is noticed through the connection.

Both hosts here are loopback addresses (127.0.0.1 and 127.0.0.2), so nothing leaves the machine.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import numpy
import torch
import trio
import trio.testing

from omnitrio.envelopes import Payload, ToStage
from omnitrio.switchboard import Lease, Switchboard
from omnitrio.transport import wire
from omnitrio.transport.relay import ShmPool, ShmReader


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
async def two_boards(host_a: str, host_b: str) -> AsyncIterator[tuple[Switchboard, Switchboard, Sink]]:
    """Board "a" (sending) and board "b" (with stage "s" as a Sink), connected over TCP."""
    homes = {"s": "b"}
    sink = Sink()
    a, b = Switchboard("a", homes), Switchboard("b", homes, stages={"s": sink})
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await nursery.start(b.run)
        address_a = await a.listen(f"tcp://{host_a}:*", f"{PREFIX}a-")
        address_b = await b.listen(f"tcp://{host_b}:*", f"{PREFIX}b-")
        assert address_a.startswith(f"tcp://{host_a}:") and not address_a.endswith(":*")
        a.peer_up("b", address_b)
        b.peer_up("a", address_a)
        yield a, b, sink
        nursery.cancel_scope.cancel()


async def test_a_tensor_to_another_host_rides_in_tcp_frames() -> None:
    tensor = torch.arange(1 << 20, dtype=torch.float32)
    async with two_boards("127.0.0.1", "127.0.0.2") as (a, _, sink):
        a.send(Payload("r", 0, "s", "src", {"t": tensor}))
        body, leases = await sink.received.receive()
        assert torch.equal(body["t"], tensor)
        assert leases == [] and our_shm() == []


def address(buffer: Any) -> int:
    return int(numpy.frombuffer(buffer, dtype=numpy.uint8).ctypes.data)


def test_tensors_for_another_host_are_packed_out_of_band_without_a_copy() -> None:
    tensor, array = torch.arange(1 << 20, dtype=torch.float32), numpy.arange(1 << 18, dtype=numpy.int64)
    with ShmPool(f"{PREFIX}oob-") as pool, ShmReader() as reader:
        packed = pool.pack({"t": tensor, "a": array, "small": torch.ones(4)}, out_of_band=True)
        assert len(packed.header) < 1024 and packed.leases == () and our_shm() == []
        assert [address(b) for b in packed.buffers] == [tensor.data_ptr(), array.ctypes.data]
        received = [bytearray(b) for b in packed.buffers]  # as the frames arrive
        body, leases = reader.unpack(packed.header, received)
    assert torch.equal(body["t"], tensor) and numpy.array_equal(body["a"], array) and leases == ()
    assert body["t"].data_ptr() == address(received[0]) and body["a"].ctypes.data == address(received[1])


async def test_a_tensor_to_this_host_goes_through_shared_memory() -> None:
    tensor = torch.arange(1 << 20, dtype=torch.float32)
    async with two_boards("127.0.0.1", "127.0.0.1") as (a, _, sink):
        a.send(Payload("r", 0, "s", "src", {"t": tensor}))
        body, leases = await sink.received.receive()
        assert torch.equal(body["t"], tensor)
        assert [owner for owner, _ in leases] == ["a"]
    assert our_shm() == []


async def test_control_messages_wait_in_order_for_the_task_that_reads_them() -> None:
    async with two_boards("127.0.0.1", "127.0.0.1") as (a, b, sink):
        a.send_control("b", wire.HealthQuery(1))
        a.send_control("b", wire.Shutdown())
        a.send(Payload("r", 0, "s", "src", "after"))
        assert (await sink.received.receive())[0] == "after"  # so both control messages have arrived
        assert b.control.receive_nowait() == ("a", wire.HealthQuery(1))
        assert b.control.receive_nowait() == ("a", wire.Shutdown())


async def test_a_peer_that_goes_away_is_noticed_through_the_connection() -> None:
    a, b = Switchboard("a", {}), Switchboard("b", {})
    lost = trio.Event()
    b_alive = trio.CancelScope()

    async def run_b(task_status: trio.TaskStatus[None]) -> None:
        with b_alive:
            await b.run(task_status=task_status)

    async def watch() -> None:
        await a.lost("b")
        lost.set()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            await nursery.start(run_b)
            await a.listen("tcp://127.0.0.1:*", f"{PREFIX}a-")
            a.peer_up("b", await b.listen("tcp://127.0.0.2:*", f"{PREFIX}b-"))
            a.send_control("b", wire.HealthQuery(1))
            assert await b.control.receive() == ("a", wire.HealthQuery(1))  # connected
            nursery.start_soon(watch)
            await trio.testing.wait_all_tasks_blocked()  # watch waits on the live connection
            assert not lost.is_set()
            b_alive.cancel()  # b closes its sockets, as a process does when it dies
            await lost.wait()
            nursery.cancel_scope.cancel()
