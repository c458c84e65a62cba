"""An asyncio event loop in a thread of its own, for aiortc, driven from trio.

aiortc is written for asyncio and the server runs on trio, so every WebRTC object (peer
connections, tracks, data channels) lives on one asyncio loop in one dedicated thread and is
touched only from that thread. :func:`open_asyncio_thread` starts it and, on exit, cancels every
task left on it, closes the loop and joins the thread.

The bridge is two calls, one for each direction:

* trio → asyncio: :meth:`AsyncioThread.run` runs a coroutine on the loop and returns its result
  (or raises its exception) in the calling trio task; cancelling that task cancels the coroutine.
  :meth:`AsyncioThread.call_soon` schedules a plain call without waiting.
* asyncio → trio: :meth:`AsyncioThread.to_trio` makes a memory channel whose send side may be used
  from the loop's thread (``send(item)`` never blocks; items arrive in the order sent). Its buffer
  is unbounded: what goes through it is real-time media and the peer's events, which arrive no faster
  than the peer sends them and are read by one trio task each.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

import trio

T = TypeVar("T")


class ToTrio(Generic[T]):
    """The asyncio side of a channel into trio: ``send`` from the loop's thread, in order, never blocking."""

    def __init__(self, token: trio.lowlevel.TrioToken, channel: trio.MemorySendChannel[T]) -> None:
        self._token = token
        self._channel = channel

    def send(self, item: T) -> None:
        try:
            self._token.run_sync_soon(self._deliver, item)
        except trio.RunFinishedError:
            pass  # the server has stopped: nobody is left to read it

    def close(self) -> None:
        try:
            self._token.run_sync_soon(self._channel.close)
        except trio.RunFinishedError:
            pass

    def _deliver(self, item: T) -> None:
        try:
            self._channel.send_nowait(item)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # the reader has gone: the call is over


class AsyncioThread:
    """The loop and its thread; see the module docstring for who may call what."""

    def __init__(self, loop: asyncio.AbstractEventLoop, token: trio.lowlevel.TrioToken) -> None:
        self.loop = loop
        self._token = token

    async def run(self, coroutine: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """``await coroutine(*args)`` on the loop; the result (or exception) comes back here."""
        future = asyncio.run_coroutine_threadsafe(coroutine(*args), self.loop)
        done = trio.Event()
        token = self._token
        future.add_done_callback(lambda _: token.run_sync_soon(done.set))
        try:
            await done.wait()
        except BaseException:
            future.cancel()
            raise
        return future.result()

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` on the loop's thread, soon; errors go to the loop's exception handler."""
        self.loop.call_soon_threadsafe(fn, *args)

    def to_trio(self) -> tuple[ToTrio[Any], trio.MemoryReceiveChannel[Any]]:
        """A channel from the loop's thread into trio (see :class:`ToTrio`)."""
        send, receive = trio.open_memory_channel[Any](math.inf)
        return ToTrio(self._token, send), receive


@asynccontextmanager
async def open_asyncio_thread(name: str = "webrtc") -> AsyncIterator[AsyncioThread]:
    """Start a thread running a fresh asyncio loop; on exit its tasks are cancelled and it is joined."""
    loop = asyncio.new_event_loop()
    ready = concurrent.futures.Future[None]()

    def main() -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set_result, None)
        loop.run_forever()
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    thread = threading.Thread(target=main, name=f"omnitrio-{name}", daemon=True)
    thread.start()
    await trio.to_thread.run_sync(ready.result)
    try:
        yield AsyncioThread(loop, trio.lowlevel.current_trio_token())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(thread.join)
