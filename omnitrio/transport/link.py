"""One process's outbound connection to another: a PUSH socket and its writer.

:meth:`Link.send` never blocks: it queues the encoded message and wakes the link's pump
task, which writes everything queued during one pass of the trio loop as a single zmq
multipart message — the sender's name, then one frame per message.  Messages sent in the
same moment (a burst of submits, a fan-out) therefore reach the peer in one receive and
are handed to its stages together; and one zmq message per pass instead of one per
message keeps the per-message cost low under load.  Messages leave in the order ``send``
was called.  The connection stays open for the pipeline's life (a PUSH socket closed
while its peer is slow can lose its last messages).
"""

from __future__ import annotations

import trio

from omnitrio.transport.zmq import TrioZmqSocket

MAX_FRAMES = 4096
"""Most messages in one zmq message; a longer queue goes out in several."""


class Link:
    """Ordered, non-blocking sends to one peer process."""

    def __init__(self, socket: TrioZmqSocket, sender: bytes) -> None:
        self.socket = socket
        self._sender = sender
        self._queue: list[bytes] = []
        self._wake = trio.Event()
        self._drained = trio.Event()
        self._drained.set()

    def send(self, frame: bytes) -> None:
        if not self._queue:
            self._wake.set()
            if self._drained.is_set():
                self._drained = trio.Event()
        self._queue.append(frame)

    async def flush(self) -> None:
        """Wait until every queued message has been handed to zmq."""
        await self._drained.wait()

    async def pump(self) -> None:
        """Write queued messages, one multipart message per pass, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._queue:
                batch, self._queue = self._queue[:MAX_FRAMES], self._queue[MAX_FRAMES:]
                await self.socket.send([self._sender, *batch])
            self._drained.set()

    def close(self, linger: int = 0) -> None:
        self.socket.close(linger=linger)
