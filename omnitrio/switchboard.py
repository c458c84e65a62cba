"""The switchboard: where each message of a pipeline goes, from one process's point of view.

Every process of a pipeline — the caller's ("main", which also holds the coordinator)
and each stage process — routes through one :class:`Switchboard`.  A message for a
stage or the coordinator in this process is handed over as the object itself, by a
synchronous call; one for a stage in another process is packed (pickle plus
shared-memory tensors), encoded and written to that process's link.  A pipeline with no
stage processes never opens a socket or a shared-memory segment.

Once :meth:`Switchboard.listen` has bound this process's socket, received batches are
delivered message by message in the order of the wire, so per-edge order holds across
processes too.  Leases on shared memory received here are tagged with the process that
lent them and travel with the request that received them; when the last stage in
this process lets go of the request they go back to their owner in one
:class:`~omnitrio.transport.wire.ReleaseLeases` message.

A message for a stage goes to the process that holds that stage *for that request*: a
stage of a replicated process group lives in several processes, and the request's
incarnation number says which one it is bound to (:mod:`omnitrio.replicas`; the
coordinator binds each request when it is submitted).  Every message of a request —
payloads, fan-in inputs, stream chunks, credits, aborts — therefore reaches the same
replica, whichever process sends it.

A switchboard is whole once made: the coordinator it hands results to is built with it
(:meth:`Switchboard.for_caller`, which gives the coordinator the board's ``send``), and
process-level messages it does not handle itself — ``Ready``, ``Shutdown``, health
queries and replies — queue in :attr:`Switchboard.control`, in arrival order, for the one
task of the process that reads them; one that arrives before that task starts waits for
it.  Stages register once built (:meth:`Switchboard.attach`), before they run.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec
import trio

from omnitrio.envelopes import (
    Abort,
    Chunk,
    Complete,
    Credit,
    Cut,
    Done,
    Failed,
    Payload,
    Released,
    Skipped,
    StreamOut,
    ToCoordinator,
    ToStage,
)
from omnitrio.replicas import Replicas
from omnitrio.topology import MAIN, StageFunctionError
from omnitrio.transport import wire
from omnitrio.transport.link import Framed, Link
from omnitrio.transport.relay import RelayError, ShmPool, ShmReader
from omnitrio.transport.unix import UnixInbound, UnixLink

if TYPE_CHECKING:
    from omnitrio.transport.zmq import ZmqPeers

log = logging.getLogger(__name__)

UNIX = "unix:"
DISPATCH_SLICE = 8
"""Messages of a received batch delivered between two checkpoints."""
RELAY_SLOT_BYTES = 1 << 20
RELAY_SLOTS = 256
"""Slots of the relay pool: 256 MiB in all, enough for the tensors in flight at once."""

Lease = tuple[str, int]
Control = tuple[str, Any]
"""A process-level message and the process it came from."""


class LocalStage(Protocol):
    """What the switchboard needs of a stage in its process (:class:`omnitrio.stage.Stage`)."""

    def deliver(self, envelope: ToStage, leases: Sequence[Lease] = ()) -> None: ...

    def holds(self, request_id: str, inc: int) -> bool: ...


class LocalCoordinator(Protocol):
    """What the switchboard needs of the coordinator (:class:`omnitrio.coordinator.Coordinator`)."""

    def deliver(self, envelope: ToCoordinator) -> None: ...


C = TypeVar("C", bound=LocalCoordinator)
Send = Callable[[ToStage], None]


class Switchboard:
    """Routes the messages of one process; see the module docstring."""

    def __init__(
        self,
        name: str,
        homes: dict[str, str],
        replicas: Replicas | None = None,
        *,
        stages: Mapping[str, LocalStage] | None = None,
        coordinator: Callable[[Send], LocalCoordinator] | None = None,
    ) -> None:
        """``name``: this process; ``homes``: the process group of every stage of the pipeline;
        ``replicas``: how many copies of each group run (one each when None); ``stages``:
        stages of this process that exist already (more with :meth:`attach`);
        ``coordinator``: builds the coordinator from this board's :meth:`send`, in the
        caller's process only (see :meth:`for_caller`)."""
        self.name = name
        self._name_frame = name.encode()
        self.homes = homes
        self.replicas = Replicas(homes) if replicas is None else replicas
        self.group = self.replicas.group_of(name)[0]
        self.stages: dict[str, LocalStage] = dict(stages or {})
        """This process's stages by name."""
        self._control_in, self.control = trio.open_memory_channel[Control](math.inf)
        """Process-level messages the switchboard does not handle itself, in arrival order;
        unbounded (they are few: start-up, health, shutdown), read by one task."""
        self.down: set[str] = set()
        self._links: dict[str, Link] = {}
        self._far: set[str] = set()  # peers on another host: tensors go inline over TCP, never shared memory
        self._host = ""
        self._pool: ShmPool | None = None
        self._reader = ShmReader()
        self._kept: dict[tuple[str, int], list[Lease]] = {}  # see let_go
        self._zmq: ZmqPeers | None = None
        self._unix_inbound: UnixInbound | None = None
        self._nursery: trio.Nursery | None = None
        self.coordinator: LocalCoordinator | None = None if coordinator is None else coordinator(self.send)
        """The coordinator, in the caller's process only."""

    @classmethod
    def for_caller(
        cls, name: str, homes: dict[str, str], replicas: Replicas, coordinator: Callable[[Send], C]
    ) -> tuple[Switchboard, C]:
        """The caller's board and its coordinator, which ``coordinator(send)`` builds on it."""
        built: list[C] = []

        def build(send: Send) -> C:
            built.append(coordinator(send))
            return built[0]

        return cls(name, homes, replicas, coordinator=build), built[0]

    def attach(self, stages: Mapping[str, LocalStage]) -> None:
        """Route to ``stages`` (built on this board, so made after it) from now on; call before they run."""
        self.stages.update(stages)

    # -- outbound -------------------------------------------------------------------

    def send(self, envelope: ToStage | ToCoordinator) -> None:
        """Route one message; sends never block.

        Raises :class:`StageFunctionError` when user data cannot cross to another
        process (it cannot be pickled) or that process is down: the sending stage fails
        that one request.
        """
        match envelope:
            case Complete() | StreamOut() | Failed() | Released() | Skipped():
                if self.coordinator is not None:
                    self.coordinator.deliver(envelope)
                    return
                dest = MAIN
            case _:
                dest = self.replicas.process_of(envelope.to, envelope.inc)
                if dest == self.name:
                    self.stages[envelope.to].deliver(envelope)
                    return
        self._send_remote(dest, envelope)

    def _send_remote(self, dest: str, envelope: ToStage | ToCoordinator) -> None:
        if dest in self.down:
            if isinstance(envelope, Payload | Chunk | Done):
                raise StageFunctionError(
                    f"sending to stage {envelope.to!r}", "ProcessDown", f"process {dest!r} is down (restarting)"
                )
            return
        if wire.carries_body(envelope):
            envelope, buffers = self._pack(dest, envelope)
            self.send_control(dest, envelope, buffers)
        else:
            self.send_control(dest, envelope)

    def _pack(self, dest: str, envelope: Any) -> tuple[Any, tuple[memoryview, ...]]:
        """The envelope with its user data packed for ``dest``, and the out-of-band buffers to send with it."""
        assert self._pool is not None, "listen() before sending to another process"
        body = (envelope.body, envelope.metadata) if isinstance(envelope, Chunk) else envelope.body
        try:
            packed = self._pool.pack(body, peer=dest, out_of_band=dest in self._far)
        except Exception as exc:
            target = getattr(envelope, "to", "the caller")
            raise StageFunctionError(
                f"sending to {target!r} in process {dest!r}",
                type(exc).__name__,
                f"the data cannot cross a process boundary: {exc}",
            ) from exc
        if isinstance(envelope, Chunk):
            return msgspec.structs.replace(envelope, body=packed.header, metadata=None), packed.buffers
        return msgspec.structs.replace(envelope, body=packed.header), packed.buffers

    def transport_to(self, stage: str) -> str:
        """``"local"`` for a stage in this process, ``"ipc"`` for one in another."""
        return "local" if self.homes.get(stage) == self.group else "ipc"

    def send_control(self, dest: str, message: Any, buffers: tuple[memoryview, ...] = ()) -> None:
        """Send an encoded message (and the out-of-band buffers of its user data) to process
        ``dest``; dropped when no link to it is open."""
        link = self._links.get(dest)
        if link is None:
            log.debug("switchboard %r: dropping %s for unknown process %r", self.name, type(message).__name__, dest)
            return
        link.send(wire.encode(message), buffers)

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

    def _dispatch(self, src: str, frame: bytes | Framed) -> None:
        buffers: Sequence[memoryview] = ()
        if isinstance(frame, Framed):
            buffers = frame.buffers
            frame = frame.message
        message = wire.decode(frame)
        match message:
            case Payload() | Chunk() | Done() | Cut() | Abort() | Credit():
                self._to_stage(src, message, buffers)
            case Complete() | StreamOut() | Failed() | Released() | Skipped():
                self._to_coordinator(src, message, buffers)
            case wire.ReleaseLeases(leases=ids):
                if self._pool is not None:
                    self._pool.release(ids)
            case wire.PeerDown(process=process):
                self.peer_down(process)
            case wire.PeerUp(process=process, address=address):
                self.peer_up(process, address)
            case _:
                self._control_in.send_nowait((src, message))

    def _unpack(self, src: str, message: Any, buffers: Sequence[memoryview]) -> tuple[Any, list[Lease]] | None:
        """User data of ``message`` and the leases it holds; None (leases returned) if unreadable."""
        try:
            body, ids = self._reader.unpack(message.body, buffers)
        except RelayError as exc:
            self.release([(src, i) for i in exc.leases])
            log.error("switchboard %r: unreadable data from %r: %s", self.name, src, exc)
            return None
        return body, [(src, i) for i in ids]

    def _to_stage(self, src: str, message: ToStage, buffers: Sequence[memoryview]) -> None:
        leases: list[Lease] = []
        if wire.carries_body(message):
            unpacked = self._unpack(src, message, buffers)
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

    def _to_coordinator(self, src: str, message: ToCoordinator, buffers: Sequence[memoryview]) -> None:
        if self.coordinator is None:
            return
        if wire.carries_body(message):
            unpacked = self._unpack(src, message, buffers)
            if unpacked is None:
                return
            body, leases = unpacked
            if leases:
                # The caller keeps results as long as it likes: copy out, then give the memory back.
                body = copy.deepcopy(body)
                self.release(leases)
            message.body = body  # type: ignore[union-attr]
        self.coordinator.deliver(message)

    async def _dispatch_batch(self, src: str, frames: Sequence[bytes | Framed]) -> None:
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
                log.exception("switchboard %r: failed to handle a message from %r", self.name, src)

    # -- peers ----------------------------------------------------------------------

    def peer_down(self, process: str) -> None:
        """``process`` died: refuse sends to it and free every lease lent to it."""
        self.down.add(process)
        if self._pool is not None:
            self._pool.release_all_for(process)

    def peer_up(self, process: str, address: str) -> None:
        """Connect to ``process`` at ``address`` (again, after a restart: what was queued for
        the dead one is dropped) and accept sends to it."""
        assert self._nursery is not None, "peer_up() while the switchboard runs"
        old = self._links.pop(process, None)
        if old is not None:
            old.close()
        link: Link
        if address.startswith(UNIX):
            link = UnixLink(address.removeprefix(UNIX), self._name_frame)
        else:
            link = self._zmq_peers().link(address, self._name_frame)
        self._links[process] = link
        if _host(address) != self._host:
            self._far.add(process)
        else:
            self._far.discard(process)
        self._nursery.start_soon(link.pump)
        self.down.discard(process)

    async def lost(self, process: str) -> None:
        """Return when the connection to ``process`` drops (see :meth:`Link.lost`); never
        when there is no link to it or its transport cannot tell."""
        link = self._links.get(process)
        if link is None:
            await trio.sleep_forever()
        else:
            await link.lost()

    def _zmq_peers(self) -> ZmqPeers:
        if self._zmq is None:
            from omnitrio.transport.zmq import ZmqPeers

            self._zmq = ZmqPeers()
        return self._zmq

    # -- lifetime -------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold this process's sockets and links until cancelled; close them on the way out."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self.close()

    async def listen(self, address: str, shm_prefix: str) -> str:
        """Receive on ``address`` from now on; tensors sent from here go through shared
        memory named ``shm_prefix…`` to peers on this host, inline to peers on another (a
        ``tcp://`` address with another host).  Call while :meth:`run` runs.

        Returns the address bound: ``address`` with a ``tcp://host:*`` port resolved.
        """
        assert self._nursery is not None, "listen() while the switchboard runs"
        self._pool = ShmPool(shm_prefix, slot_bytes=RELAY_SLOT_BYTES, slots=RELAY_SLOTS)
        if address.startswith(UNIX):
            self._unix_inbound = UnixInbound(address.removeprefix(UNIX))
            await self._nursery.start(self._unix_inbound.serve, self._dispatch_batch)
        else:
            await self._nursery.start(self._zmq_peers().serve, address, self._dispatch_batch)
            address = self._zmq_peers().address
        self._host = _host(address)
        return address

    async def prepare_shared_memory(self) -> None:
        """Create this process's shared-memory pool now (in a thread, after :meth:`listen`), so that the
        first tensor it sends to another process does not pay for creating it."""
        if self._pool is not None:
            await trio.to_thread.run_sync(self._pool.prepare)

    async def flush(self) -> None:
        """Wait until every queued outbound message has been handed to its transport."""
        for link in list(self._links.values()):
            await link.flush()

    def close(self) -> None:
        """Close sockets and unlink this process's shared memory; idempotent."""
        for link in self._links.values():
            link.close(linger=200)
        self._links.clear()
        if self._unix_inbound is not None:
            self._unix_inbound.close()
        if self._zmq is not None:
            self._zmq.close()
            self._zmq = None
        if self._pool is not None:
            self._pool.close()
        self._reader.close()


def _host(address: str) -> str:
    """The host of a ``tcp://host:port`` address; "" for local ones (Unix, ``ipc://``)."""
    if not address.startswith("tcp://"):
        return ""
    return address.removeprefix("tcp://").rsplit(":", 1)[0]
