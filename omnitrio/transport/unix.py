"""The same-host fast path: length-prefixed frames over Unix stream sockets under trio.

A zmq hop crosses libzmq's IO thread in both processes — two more thread wake-ups per
message, which on a busy 2-core machine cost more than everything else in a hop.  A
Unix stream socket is one ``send`` and one ``recv`` in the two trio loops.  The promises
are those of :mod:`omnitrio.transport.link`: ordered per link, everything sent in one
pass of the trio loop arrives in one batch, ``send`` never blocks (the pump waits on the
kernel buffer: backpressure), and the connection stays open for the pipeline's life.  A link
made before its peer listens connects once it does, however late (zmq's do the same).

Wire format of one batch: ``u32 length`` then ``u16 len(sender) | sender`` then, per
message, ``u32 len | message``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
from collections.abc import Awaitable, Callable

import trio

from omnitrio.transport.link import Framed, Link

_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
READ_SIZE = 1 << 16
CONNECT_RETRY_FIRST = 0.005
CONNECT_RETRY_MAX = 0.1
"""Seconds between attempts to connect to a peer that does not listen yet: doubling from the first to the most."""

Dispatch = Callable[[str, list[bytes]], Awaitable[None]]


def encode_batch(sender: bytes, frames: list[bytes]) -> bytes:
    parts = [b"", _U16.pack(len(sender)), sender]
    for frame in frames:
        parts.append(_U32.pack(len(frame)))
        parts.append(frame)
    body = b"".join(parts)
    return _U32.pack(len(body)) + body


def decode_batch(body: memoryview) -> tuple[str, list[bytes]]:
    (n,) = _U16.unpack_from(body, 0)
    sender = bytes(body[2 : 2 + n]).decode()
    pos, end, frames = 2 + n, len(body), []
    while pos < end:
        (size,) = _U32.unpack_from(body, pos)
        pos += 4
        frames.append(bytes(body[pos : pos + size]))
        pos += size
    return sender, frames


class UnixLink(Link):
    """A link over a Unix stream socket: one length-prefixed record per batch."""

    def __init__(self, path: str, sender: bytes) -> None:
        super().__init__(sender)
        self.path = path
        self._stream: trio.SocketStream | None = None

    async def _open(self) -> None:
        """Connect, waiting for the peer to listen for as long as it takes, until the link is closed.

        A peer may listen long after this side asked (a stage process that imports and builds its
        model first, on a loaded machine); giving up would drop every message sent to it for the
        pipeline's life.  What bounds the wait is the peer's life: a peer that never comes up fails
        the pipeline's start-up; one restarted listens on a fresh address, reached by a new link
        (this one closed); one gone for good is tried every :data:`CONNECT_RETRY_MAX` until the
        pipeline closes.
        """
        pause = CONNECT_RETRY_FIRST
        while True:
            if self._closed:
                raise trio.ClosedResourceError("the link was closed")
            try:
                stream = await trio.open_unix_socket(self.path)
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ECONNREFUSED):
                    raise
                await trio.sleep(pause)  # the peer has not bound yet
                pause = min(2 * pause, CONNECT_RETRY_MAX)
                continue
            if self._closed:
                stream.socket.close()
                raise trio.ClosedResourceError("the link was closed")
            self._stream = stream
            return

    async def _write(self, sender: bytes, batch: list[bytes | Framed]) -> None:
        if self._stream is None:
            raise trio.ClosedResourceError("the link was closed")
        # Never a Framed: a peer on this host gets tensors through shared memory.
        await self._stream.send_all(encode_batch(sender, batch))  # type: ignore[arg-type]

    def close(self, linger: int = 0) -> None:
        super().close(linger)
        if self._stream is not None:
            stream, self._stream = self._stream, None
            with contextlib.suppress(OSError):
                stream.socket.close()


class UnixInbound:
    """This process's listening socket: one reader task per connected peer."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._listener: trio.socket.SocketType | None = None

    async def serve(self, dispatch: Dispatch, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        await sock.bind(self.path)
        sock.listen(64)
        self._listener = sock
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                while True:
                    conn, _ = await sock.accept()
                    nursery.start_soon(_read_batches, trio.SocketStream(conn), dispatch)
        finally:
            self.close()

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


async def _read_batches(stream: trio.SocketStream, dispatch: Dispatch) -> None:
    buffer = bytearray()
    try:
        while True:
            data = await stream.receive_some(READ_SIZE)
            if not data:
                return
            buffer += data
            pos = 0
            view = memoryview(buffer)
            while len(buffer) - pos >= 4:
                (size,) = _U32.unpack_from(buffer, pos)
                if len(buffer) - pos - 4 < size:
                    break
                sender, frames = decode_batch(view[pos + 4 : pos + 4 + size])
                pos += 4 + size
                await dispatch(sender, frames)
            view.release()
            del buffer[:pos]
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return
    finally:
        with contextlib.suppress(OSError):
            stream.socket.close()
