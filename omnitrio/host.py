"""One process's share of a pipeline: its stages, its sockets, its shared-memory relay.

Every process of a pipeline — the caller's ("main", which also holds the coordinator)
and each spawned stage process — runs one :class:`Host` in its trio loop.  The host is
the stages' switchboard: a message for a stage or the coordinator in this process is
handed over as the object itself; one for another process is packed (pickle plus
shared-memory tensors), encoded and written to that process's :class:`Link`.  One
receiver task drains this process's PULL socket in batches and delivers each message
synchronously, so per-edge order is the order of the wire.

Leases on shared memory received here are tagged with the process that lent them and
travel with the request scope that received them; when the scope ends they go back to
their owner in one :class:`ReleaseLeases` message.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import trio
import zmq

from omnitrio.coordinator import Coordinator
from omnitrio.envelopes import (
    Abort,
    Chunk,
    Complete,
    Credit,
    Done,
    Failed,
    Payload,
    Released,
    StreamOut,
    ToCoordinator,
    ToStage,
)
from omnitrio.stage import Stage
from omnitrio.topology import StageFunctionError
from omnitrio.transport import wire
from omnitrio.transport.link import Link, ZmqLink
from omnitrio.transport.relay import RelayError, ShmPool, ShmReader
from omnitrio.transport.unix import UnixInbound, UnixLink
from omnitrio.transport.zmq import TrioZmqSocket, bind, connect

log = logging.getLogger(__name__)

MAIN = "main"
UNIX = "unix:"
HWM = 100_000
RECV_BATCH = 4096
DISPATCH_SLICE = 8
RELAY_SLOT_BYTES = 1 << 20
RELAY_SLOTS = 256

Lease = tuple[str, int]


class Host:
    """The switchboard and sockets of one process."""

    def __init__(
        self,
        name: str,
        homes: dict[str, str],
        addresses: dict[str, str],
        shm_prefix: str,
        on_control: Callable[[str, Any], None],
    ) -> None:
        self.name = name
        self._name_frame = name.encode()
        self.homes = homes
        self.addresses = dict(addresses)
        self.stages: dict[str, Stage] = {}
        self.coordinator: Coordinator | None = None
        self.down: set[str] = set()
        self._on_control = on_control
        self._links: dict[str, Link] = {}
        self._pool = ShmPool(shm_prefix, slot_bytes=RELAY_SLOT_BYTES, slots=RELAY_SLOTS)
        self._reader = ShmReader()
        self._kept: dict[tuple[str, int], list[Lease]] = {}  # see let_go
        self._ctx: zmq.Context[Any] | None = None
        self._inbound: TrioZmqSocket | None = None
        self._unix_inbound: UnixInbound | None = None
        self._nursery: trio.Nursery | None = None

    # -- outbound -------------------------------------------------------------------

    def send(self, envelope: ToStage | ToCoordinator) -> None:
        """Route one message; sends never block.

        Raises :class:`StageFunctionError` when user data cannot cross to another
        process (it cannot be pickled) or that process is down: the sending stage fails
        that one request.
        """
        match envelope:
            case Complete() | StreamOut() | Failed() | Released():
                if self.coordinator is not None:
                    self.coordinator.deliver(envelope)
                    return
                dest = MAIN
            case _:
                dest = self.homes[envelope.to]
                if dest == self.name:
                    self.stages[envelope.to].deliver(envelope)
                    return
        self._send_remote(dest, envelope)

    def _send_remote(self, dest: str, envelope: ToStage | ToCoordinator) -> None:
        if dest in self.down:
            if isinstance(envelope, Payload | Chunk | Done):
                stage = getattr(envelope, "to", dest)
                raise StageFunctionError(
                    f"sending to stage {stage!r}", "ProcessDown", f"process {dest!r} is down (restarting)"
                )
            return
        if wire.carries_body(envelope):
            envelope = self._pack(dest, envelope)
        self.send_control(dest, envelope)

    def _pack(self, dest: str, envelope: Any) -> Any:
        body = (envelope.body, envelope.metadata) if isinstance(envelope, Chunk) else envelope.body
        try:
            packed = self._pool.pack(body, peer=dest)
        except Exception as exc:
            target = getattr(envelope, "to", "the caller")
            raise StageFunctionError(
                f"sending to {target!r} in process {dest!r}",
                type(exc).__name__,
                f"the data cannot cross a process boundary: {exc}",
            ) from exc
        if isinstance(envelope, Chunk):
            return msgspec.structs.replace(envelope, body=packed.header, metadata=None)
        return msgspec.structs.replace(envelope, body=packed.header)

    def transport_to(self, stage: str) -> str:
        return "local" if self.homes.get(stage) == self.name else "ipc"

    def send_control(self, dest: str, message: Any) -> None:
        link = self._links.get(dest)
        if link is None:
            log.debug("host %r: dropping %s for unknown process %r", self.name, type(message).__name__, dest)
            return
        link.send(wire.encode(message))

    def let_go(self, request_id: str, inc: int, stage: str, leases: Sequence[Lease]) -> None:
        """``stage`` has let go of the request: free its leases, unless a stage here still holds it.

        A stage that hands its result or a chunk to a stage in this process passes the
        object itself, so the zero-copy views it received may now live in the other
        stage's request.  The leases therefore stay until the last stage in this process
        lets go of that request; they are kept per request and go with it.
        """
        key = (request_id, inc)
        kept = self._kept.get(key)
        if kept is None and not leases:
            return
        if any(other.holds(request_id, inc) for name, other in self.stages.items() if name != stage):
            self._kept.setdefault(key, []).extend(leases)
            return
        self._kept.pop(key, None)
        self.release([*(kept or ()), *leases])

    def release(self, leases: Sequence[Lease]) -> None:
        """Give received shared-memory leases back to the processes that lent them."""
        by_owner: dict[str, list[int]] = {}
        for owner, lease_id in leases:
            by_owner.setdefault(owner, []).append(lease_id)
        for owner, ids in by_owner.items():
            if owner not in self.down:
                self.send_control(owner, wire.ReleaseLeases(ids))

    # -- inbound --------------------------------------------------------------------

    def _dispatch(self, src: str, frame: bytes) -> None:
        message = wire.decode(frame)
        match message:
            case Payload() | Chunk() | Done() | Abort() | Credit():
                self._to_stage(src, message)
            case Complete() | StreamOut() | Failed() | Released():
                self._to_coordinator(src, message)
            case wire.ReleaseLeases(leases=ids):
                self._pool.release(ids)
            case wire.PeerDown(process=process):
                self.peer_down(process)
            case wire.PeerUp(process=process, address=address):
                self.peer_up(process, address)
            case _:
                self._on_control(src, message)

    def _unpack(self, src: str, message: Any) -> tuple[Any, list[Lease]] | None:
        """User data of ``message`` and the leases it holds; None (leases returned) if unreadable."""
        try:
            body, ids = self._reader.unpack(message.body)
        except RelayError as exc:
            self.release([(src, i) for i in exc.leases])
            log.error("host %r: unreadable data from %r: %s", self.name, src, exc)
            return None
        return body, [(src, i) for i in ids]

    def _to_stage(self, src: str, message: ToStage) -> None:
        leases: list[Lease] = []
        if wire.carries_body(message):
            unpacked = self._unpack(src, message)
            if unpacked is None:
                self.send(Failed(message.rid, message.inc, message.to, "RelayError", "received data was unreadable"))
                return
            body, leases = unpacked
            if isinstance(message, Chunk):
                message.body, message.metadata = body
            else:
                message.body = body  # type: ignore[union-attr]
        stage = self.stages.get(message.to)
        if stage is None:
            self.release(leases)
            return
        stage.deliver(message, leases)

    def _to_coordinator(self, src: str, message: ToCoordinator) -> None:
        if self.coordinator is None:
            return
        if wire.carries_body(message):
            unpacked = self._unpack(src, message)
            if unpacked is None:
                return
            body, leases = unpacked
            if leases:
                # The caller keeps results as long as it likes: copy out, then give the memory back.
                body = copy.deepcopy(body)
                self.release(leases)
            message.body = body  # type: ignore[union-attr]
        self.coordinator.deliver(message)

    # -- peers ----------------------------------------------------------------------

    def peer_down(self, process: str) -> None:
        """``process`` died: refuse sends to it and free every lease lent to it."""
        self.down.add(process)
        self._pool.release_all_for(process)

    def peer_up(self, process: str, address: str) -> None:
        """``process`` restarted at ``address``: reconnect (dropping what was queued for the dead one)."""
        old = self._links.pop(process, None)
        if old is not None:
            old.close()
        self.addresses[process] = address
        self._connect(process)
        self.down.discard(process)

    def _connect(self, process: str) -> None:
        assert self._nursery is not None
        address = self.addresses[process]
        link: Link
        if address.startswith(UNIX):
            link = UnixLink(address.removeprefix(UNIX), self._name_frame)
        else:
            assert self._ctx is not None
            socket = connect(self._ctx, zmq.PUSH, address, options={zmq.SNDHWM: HWM}, linger=2000)
            link = ZmqLink(socket, self._name_frame)
        self._links[process] = link
        self._nursery.start_soon(link.pump)

    # -- lifetime -------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind this process's socket, connect to the others, deliver until cancelled."""
        self._ctx = zmq.Context()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                own = self.addresses[self.name]
                if own.startswith(UNIX):
                    self._unix_inbound = UnixInbound(own.removeprefix(UNIX))
                    await nursery.start(self._unix_inbound.serve, self._dispatch_batch)
                else:
                    self._inbound, _ = bind(self._ctx, zmq.PULL, own, options={zmq.RCVHWM: HWM})
                    nursery.start_soon(self._receive)
                for process in self.addresses:
                    if process != self.name:
                        self._connect(process)
                task_status.started()
        finally:
            self.close()

    async def _receive(self) -> None:
        assert self._inbound is not None
        while True:
            for frames in await self._inbound.recv_multipart_batch(RECV_BATCH):
                await self._dispatch_batch(frames[0].decode(), frames[1:])

    async def _dispatch_batch(self, src: str, frames: list[bytes]) -> None:
        """Deliver a received batch in order, letting other tasks run every few messages.

        A burst of 100 stream chunks must not hold back the output the first one already
        produced: unpacking them all before anything else runs would.
        """
        for i, frame in enumerate(frames):
            if i and not i % DISPATCH_SLICE:
                await trio.lowlevel.checkpoint()
            try:
                self._dispatch(src, frame)
            except Exception:
                log.exception("host %r: failed to handle a message from %r", self.name, src)

    async def flush(self) -> None:
        """Wait until every queued outbound message has been handed to zmq."""
        for link in list(self._links.values()):
            await link.flush()

    def close(self) -> None:
        """Close sockets and unlink this process's shared memory; idempotent."""
        for link in self._links.values():
            link.close(linger=200)
        self._links.clear()
        if self._inbound is not None:
            self._inbound.close()
        if self._unix_inbound is not None:
            self._unix_inbound.close()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None
        self._pool.close()
        self._reader.close()
