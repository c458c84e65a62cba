"""pyzmq sockets driven by trio: any number of tasks may send and receive on one socket at once.

What a caller may rely on:

- **Ordering.** Messages leave in the order their sends completed; a ``send_batch`` sends its messages in list
  order, and messages come out of ``recv``/``recv_batch`` in the order zmq delivers them (FIFO per peer).
- **Whole messages and cancellation.** Every async method is a trio checkpoint. A cancelled ``send`` sent the whole
  message or nothing (zmq accepts a multipart message atomically). A cancelled receive consumed nothing: it
  is only cancelled before it takes a message, never after. A cancelled ``send_batch`` sent a prefix of
  whole messages, in order; use ``send`` per message where the count matters.
- **Blocking.** ``send``/``send_batch`` wait only while zmq refuses the message (the HWM is reached);
  ``try_send`` never waits (for sync callbacks inside the trio run). ``recv_batch`` returns every message
  available (up to ``max_messages``) and waits only when none is.
- **Closing.** ``close()`` (also on leaving ``async with``, cancelled or not) wakes every task waiting on the
  socket with ``trio.ClosedResourceError`` and closes it with ``linger`` (default 0: unsent messages are
  dropped, so end a stream with an application-level END and ack before closing). Later calls raise
  ``trio.ClosedResourceError``. Close through this wrapper, never through the raw socket.
- **The context stays yours.** ``ctx.term()`` blocks until every socket on it is closed; close the sockets
  first, then call it (or ``ctx.destroy(linger=0)``). A socket belongs to the thread of its trio run.

Why it is shaped so: ``zmq.FD`` is edge-triggered and signals POLLIN and POLLOUT changes alike. Any send,
recv or ``EVENTS`` read can consume the edge another waiter needed, so after each of them (while anyone
waits) ``_poll`` re-reads ``EVENTS`` and wakes the waiters whose condition now holds. Trio lets one task at a
time wait on an fd, so the first waiter owns ``wait_readable(FD)`` and the others park; ``_poll`` also kicks
the owner out of its wait, and an owner that leaves hands the fd on by waking the parked tasks.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from functools import partial
from types import TracebackType
from typing import Any, Self, TypeVar, cast

import trio
import zmq
from zmq.utils.monitor import parse_monitor_message

from omnitrio.transport.link import Framed, Link

Frame = bytes | bytearray | memoryview
Message = Frame | Sequence[Frame]
_T = TypeVar("_T")
_POLLIN, _POLLOUT = int(zmq.POLLIN), int(zmq.POLLOUT)  # plain ints: IntFlag's `&` costs microseconds


class TrioZmqSocket:
    """One zmq socket used from trio tasks; see the module docstring for the promises."""

    def __init__(self, sock: zmq.Socket[Any], *, linger: int = 0) -> None:
        if not isinstance(sock, zmq.Socket):
            raise TypeError(f"TrioZmqSocket needs a zmq.Socket, got {type(sock).__name__}")
        if sock.closed:
            raise ValueError("TrioZmqSocket needs an open zmq.Socket, got a closed one")
        self.socket = sock
        self.linger = linger
        self._fd = cast(int, sock.getsockopt(zmq.FD))
        self._lots: dict[int, trio.lowlevel.ParkingLot] = {
            _POLLIN: trio.lowlevel.ParkingLot(),
            _POLLOUT: trio.lowlevel.ParkingLot(),
        }
        self._owner: tuple[int, trio.CancelScope] | None = None  # (flag awaited, scope of its wait_readable)
        self._ipc_file: str | None = None  # set by bind(): libzmq 4.3 leaves the file behind, close() removes it

    async def send(self, message: Message, *, copy: bool = True) -> None:
        """Send one message: ``bytes`` is one frame, a sequence of bytes is a multipart message.

        ``copy=False``: zmq sends big frames from the caller's buffers, which must not
        change until they are sent (pyzmq keeps them alive until then).
        """
        await self.send_batch((message,), copy=copy)

    async def send_batch(self, messages: Iterable[Message], *, copy: bool = True) -> None:
        """Send many messages in order, waiting only on the HWM (one checkpoint, not one per message)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        yielded = False
        try:
            for message in messages:
                while not self._send_nowait(message, copy):
                    yielded |= await self._wait(_POLLOUT)
        finally:
            self._wake_others()
        if not yielded:
            await trio.lowlevel.cancel_shielded_checkpoint()

    def try_send(self, message: Message) -> bool:
        """Send without waiting (no checkpoint): True if zmq took the whole message, False at the HWM."""
        sent = self._send_nowait(message)
        self._wake_others()
        return sent

    async def recv(self) -> bytes:
        """Receive one frame (a multipart message comes one frame per call; use ``recv_multipart``)."""
        return (await self._recv_many(self.socket.recv, 1))[0]

    async def recv_batch(self, max_messages: int = 1024) -> list[bytes]:
        """Every single-frame message available now (at least one, at most ``max_messages``)."""
        return await self._recv_many(self.socket.recv, max_messages)

    async def recv_multipart(self) -> list[bytes]:
        """Receive one whole multipart message as its list of frames."""
        return (await self._recv_many(self.socket.recv_multipart, 1))[0]

    async def recv_multipart_batch(self, max_messages: int = 1024) -> list[list[bytes]]:
        """Every multipart message available now (at least one, at most ``max_messages``)."""
        return await self._recv_many(self.socket.recv_multipart, max_messages)

    async def recv_batch_with(self, read: Callable[[int], _T], max_messages: int = 1024) -> list[_T]:
        """Every message available now, each taken by ``read(flags)`` (which reads all of
        its frames from :attr:`socket` and raises ``zmq.Again`` when there is none)."""
        return await self._recv_many(read, max_messages)

    def close(self, linger: int | None = None) -> None:
        """Close the socket (idempotent); pending and later calls raise ``trio.ClosedResourceError``."""
        if self.socket.closed:
            return
        if trio.lowlevel.in_trio_run():
            trio.lowlevel.notify_closing(self._fd)  # the fd owner's wait raises ClosedResourceError
        self.socket.close(linger=self.linger if linger is None else linger)
        if self._ipc_file is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._ipc_file)
        for lot in self._lots.values():
            lot.unpark_all()  # parked tasks re-check and find the socket closed

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def _recv_many(self, op: Callable[[int], _T], max_messages: int) -> list[_T]:
        if max_messages < 1:
            raise ValueError(f"max_messages must be at least 1, got {max_messages}")
        await trio.lowlevel.checkpoint_if_cancelled()
        out: list[_T] = []
        yielded = False
        try:
            while not out:
                self._check_open()
                try:
                    while len(out) < max_messages:
                        out.append(op(zmq.NOBLOCK))
                except zmq.Again:
                    pass  # drained: everything available is in `out`
                if not out:
                    yielded |= await self._wait(_POLLIN)
        finally:
            self._wake_others()
        if not yielded:
            await trio.lowlevel.cancel_shielded_checkpoint()
        return out

    def _send_nowait(self, message: Message, copy: bool = True) -> bool:
        self._check_open()
        try:
            match message:
                case bytes() | bytearray() | memoryview():
                    self.socket.send(message, zmq.NOBLOCK, copy=copy)
                case str():
                    raise TypeError("a zmq frame is bytes, got str: encode it first")
                case []:
                    raise ValueError("a zmq message needs at least one frame, got an empty sequence")
                case _:
                    self.socket.send_multipart(message, zmq.NOBLOCK, copy=copy)
        except zmq.Again:
            return False
        return True

    def _check_open(self) -> None:
        if self.socket.closed:
            raise trio.ClosedResourceError("the zmq socket was closed")

    def _poll(self) -> int:
        """Re-read EVENTS (consuming the FD's edge) and wake every waiter whose condition now holds."""
        events = int(self.socket.getsockopt(zmq.EVENTS))
        for flag, lot in self._lots.items():
            if events & flag and lot:
                lot.unpark_all()
        if self._owner is not None and events & self._owner[0]:
            self._owner[1].cancel()
        return events

    def _wake_others(self) -> None:
        """After a send or recv: with nobody waiting there is no edge to lose (a waiter polls before it waits)."""
        if not self.socket.closed and (self._owner is not None or any(self._lots.values())):
            self._poll()

    async def _wait(self, flag: int) -> bool:
        """Return once EVENTS shows ``flag``; say whether this task yielded meanwhile."""
        yielded = False
        while True:
            self._check_open()
            if self._poll() & flag:
                return yielded
            yielded = True
            if self._owner is not None:
                await self._lots[flag].park()
                continue
            scope = trio.CancelScope()
            self._owner = (flag, scope)
            try:
                with scope:
                    await trio.lowlevel.wait_readable(self._fd)
            finally:
                self._owner = None
                for lot in self._lots.values():
                    if lot:
                        lot.unpark_all()  # hand the fd on: a parked task re-checks and becomes the owner


def bind(
    ctx: zmq.Context[Any],
    socket_type: int,
    endpoint: str,
    *,
    options: Mapping[zmq.SocketOption, int | bytes] | None = None,
    linger: int = 0,
) -> tuple[TrioZmqSocket, str]:
    """Open a socket bound to ``endpoint``; return it and the resolved endpoint (``tcp://127.0.0.1:*`` → port).

    ``options`` (e.g. ``{zmq.SNDHWM: 100}``) are set before binding, where zmq needs HWMs set. Closing the
    returned socket removes its ``ipc://`` file (libzmq 4.3 leaves it behind).
    """
    sock = _open(ctx, socket_type, options)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as e:
        sock.close(linger=0)
        raise OSError(e.errno, f"cannot bind zmq socket to {endpoint!r}: {e.strerror}") from e
    wrapped, resolved = TrioZmqSocket(sock, linger=linger), sock.getsockopt_string(zmq.LAST_ENDPOINT)
    if resolved.startswith("ipc://") and not resolved.startswith("ipc://@"):  # "@": abstract, no file
        wrapped._ipc_file = resolved.removeprefix("ipc://")
    return wrapped, resolved


def connect(
    ctx: zmq.Context[Any],
    socket_type: int,
    endpoint: str,
    *,
    options: Mapping[zmq.SocketOption, int | bytes] | None = None,
    linger: int = 0,
) -> TrioZmqSocket:
    """Open a socket connected to ``endpoint``; zmq connects in the background and queues meanwhile."""
    sock = _open(ctx, socket_type, options)
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as e:
        sock.close(linger=0)
        raise OSError(e.errno, f"cannot connect zmq socket to {endpoint!r}: {e.strerror}") from e
    return TrioZmqSocket(sock, linger=linger)


def _open(
    ctx: zmq.Context[Any], socket_type: int, options: Mapping[zmq.SocketOption, int | bytes] | None
) -> zmq.Socket[Any]:
    sock = ctx.socket(socket_type)
    for option, value in (options or {}).items():
        try:
            sock.setsockopt(option, value)
        except zmq.ZMQError as e:
            sock.close(linger=0)
            raise ValueError(f"zmq socket option {option} = {value!r} rejected: {e.strerror}") from e
    return sock


_MONITORS = itertools.count()


class ZmqLink(Link):
    """A link over a zmq PUSH socket: one multipart message per batch (sender, then messages).

    A message with out-of-band buffers goes as a multipart message of its own: sender, an
    empty frame (no encoded message is empty), the message, then one frame per buffer,
    sent zero-copy.
    """

    def __init__(self, socket: TrioZmqSocket, sender: bytes) -> None:
        super().__init__(sender)
        self.socket = socket

    async def _write(self, sender: bytes, batch: list[bytes | Framed]) -> None:
        start = 0
        for i, item in enumerate(batch):
            if type(item) is Framed:
                if start < i:
                    await self.socket.send([sender, *batch[start:i]])  # type: ignore[list-item]
                await self.socket.send([sender, b"", item.message, *item.buffers], copy=False)
                start = i + 1
        if start < len(batch):
            await self.socket.send([sender, *batch[start:]])  # type: ignore[list-item]

    async def lost(self) -> None:
        """Return when zmq reports the connection to the peer dropped (its socket monitor's
        ``EVENT_DISCONNECTED``), which a peer's death causes at once over TCP and ``ipc://``."""
        if self.socket.socket.closed:
            await trio.sleep_forever()
        # A fresh address: the default names the fd, which a later socket may reuse while
        # zmq still unbinds the old monitor.
        address = f"inproc://omnitrio-monitor-{next(_MONITORS)}"
        monitor = TrioZmqSocket(self.socket.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED, address))
        try:
            while True:  # EVENT_MONITOR_STOPPED (this link closed) is followed by nothing
                frames = await monitor.recv_multipart()
                if parse_monitor_message(frames)["event"] == zmq.EVENT_DISCONNECTED:
                    return
        finally:
            monitor.close()

    def close(self, linger: int = 0) -> None:
        super().close(linger)
        self.socket.close(linger=linger)


HWM = 100_000
RECV_BATCH = 4096
Dispatch = Callable[[str, list[bytes | Framed]], Awaitable[None]]


def _read_batch(socket: zmq.Socket[Any], flags: int) -> tuple[str, list[bytes | Framed]]:
    """One batch as :class:`ZmqLink` wrote it: the sender's name and its messages."""
    sender = socket.recv(flags).decode()
    frames: list[bytes | Framed] = []
    more = partial(socket.getsockopt, zmq.RCVMORE)
    while more():
        frame = socket.recv()
        if frame:
            frames.append(frame)
            continue
        message = socket.recv()
        buffers = []
        while more():
            buffers.append(socket.recv(copy=False).buffer)
        frames.append(Framed(message, tuple(buffers)))
    return sender, frames


class ZmqPeers:
    """One process's zmq side: a PULL socket it receives on and a PUSH link per peer.

    Same shape as the Unix transport (:class:`~omnitrio.transport.unix.UnixInbound` and
    :class:`~omnitrio.transport.unix.UnixLink`); the context lives until :meth:`close`.
    """

    def __init__(self) -> None:
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._inbound: TrioZmqSocket | None = None
        self.address = ""
        """Where :meth:`serve` listens, with a ``*`` port resolved (``tcp://127.0.0.1:41234``)."""

    async def serve(
        self, address: str, dispatch: Dispatch, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Bind ``address`` and hand each received batch to ``dispatch`` until cancelled.

        A message that came with out-of-band buffers is handed over as a :class:`Framed`
        whose buffers are views of the received frames (no copy).
        """
        self._inbound, self.address = bind(self._ctx, zmq.PULL, address, options={zmq.RCVHWM: HWM})
        task_status.started()
        read = partial(_read_batch, self._inbound.socket)
        while True:
            for sender, frames in await self._inbound.recv_batch_with(read, RECV_BATCH):
                await dispatch(sender, frames)

    def link(self, address: str, sender: bytes) -> ZmqLink:
        socket = connect(self._ctx, zmq.PUSH, address, options={zmq.SNDHWM: HWM}, linger=2000)
        return ZmqLink(socket, sender)

    def close(self) -> None:
        """Close the receiving socket and the context (close the links first)."""
        if self._inbound is not None:
            self._inbound.close()
        self._ctx.destroy(linger=0)
