"""One process's outbound connection to another: a PUSH socket and its writer.

:meth:`Link.send` never blocks: when nothing is queued and the socket accepts the
message at once it goes straight out (no task switch on the hot path); otherwise it
joins a queue that the link's pump task writes in batches, waiting only on zmq's
high-water mark.  Messages leave in the order ``send`` was called.  The connection stays
open for the pipeline's life (a PUSH socket closed while its peer is slow can lose its
last messages).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import trio

from omnitrio.transport.zmq import TrioZmqSocket

Frames = Sequence[bytes]


class Link:
    """Ordered, non-blocking sends to one peer process."""

    def __init__(self, socket: TrioZmqSocket) -> None:
        self.socket = socket
        self._queue: deque[Frames] = deque()
        self._wake = trio.Event()
        self._busy = False
        self._drained = trio.Event()
        self._drained.set()

    def send(self, frames: Frames) -> None:
        if not self._queue and not self._busy and self.socket.try_send(frames):
            return
        self._queue.append(frames)
        self._drained = trio.Event() if self._drained.is_set() else self._drained
        self._wake.set()

    async def flush(self) -> None:
        """Wait until every queued message has been handed to zmq."""
        await self._drained.wait()

    async def pump(self) -> None:
        """Write queued messages in batches until cancelled."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._queue:
                batch = list(self._queue)
                self._queue.clear()
                self._busy = True
                try:
                    await self.socket.send_batch(batch)
                finally:
                    self._busy = False
            self._drained.set()

    def close(self, linger: int = 0) -> None:
        self.socket.close(linger=linger)
