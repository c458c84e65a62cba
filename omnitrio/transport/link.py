"""One process's outbound connection to another: a queue and the task that writes it.

:meth:`Link.send` never blocks: it queues the encoded message and wakes the link's pump
task, which writes everything queued since it last ran as one batch — one zmq multipart
message, or one length-prefixed record on a Unix socket.  Messages sent with no
checkpoint between them (a burst of submits from one task, a fan-out) therefore reach the
peer in one receive and are handed to its stages together; sends from several tasks in
one pass of the loop share a batch unless the pump runs between them.  The per-message
cost stays low under load.
Messages leave in the order ``send`` was called; the pump waits only on the transport
(zmq's high-water mark, the kernel's socket buffer): backpressure.  Connections stay
open for the pipeline's life (a PUSH socket closed while its peer is slow can lose its
last messages).

A message may come with out-of-band buffers (tensor bytes for a peer on another host):
it is queued as a :class:`Framed`, in order with the others, and a transport that
supports it (zmq) sends the buffers as frames of their own, without copying them.
"""

from __future__ import annotations

import attrs
import trio

MAX_FRAMES = 4096
"""Most messages in one batch; a longer queue goes out in several."""


@attrs.frozen
class Framed:
    """One encoded message and the out-of-band buffers its user data was packed with."""

    message: bytes
    buffers: tuple[memoryview, ...]


class Link:
    """Ordered, non-blocking sends to one peer; subclasses say how a batch is written."""

    def __init__(self, sender: bytes) -> None:
        self._sender = sender
        self._queue: list[bytes | Framed] = []
        self._wake = trio.Event()
        self._drained = trio.Event()
        self._drained.set()
        self._closed = False

    def send(self, frame: bytes, buffers: tuple[memoryview, ...] = ()) -> None:
        if self._closed:
            return
        if not self._queue:
            self._wake.set()
            if self._drained.is_set():
                self._drained = trio.Event()
        self._queue.append(Framed(frame, buffers) if buffers else frame)

    async def flush(self) -> None:
        """Wait until every queued message has been handed to the transport."""
        await self._drained.wait()

    async def pump(self) -> None:
        """Write queued messages, one batch per pass, until cancelled or the peer is gone."""
        try:
            await self._open()
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                while self._queue:
                    batch, self._queue = self._queue[:MAX_FRAMES], self._queue[MAX_FRAMES:]
                    await self._write(self._sender, batch)
                self._drained.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, OSError):
            # The peer is gone (or this link closed): the supervisor fails what it held.
            self._closed = True
            self._queue.clear()
            self._drained.set()

    async def lost(self) -> None:
        """Return when the connection, once made, drops: the peer closed it, or died.

        Transports that cannot tell never return (a process watcher still sees deaths);
        neither does a link closed from this side.
        """
        await trio.sleep_forever()

    async def _open(self) -> None:
        """Make the connection usable (nothing to do for zmq, which connects in the background)."""

    async def _write(self, sender: bytes, batch: list[bytes | Framed]) -> None:
        raise NotImplementedError

    def close(self, linger: int = 0) -> None:
        self._closed = True
        self._queue.clear()
