"""Driving a stage's scheduler directly, as the runtime does, for tests and benchmarks.

:func:`running` serves a scheduler on a thread of its own for the length of a block; :func:`put_atomically`
hands a burst of messages to its inbox in one step under the queue's lock (the runtime's hand-off: the
scheduler sees all of them or none); :func:`wait_results` reads its outbox until that many requests have a
result, and raises on the first error, naming the request.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def serving_thread(scheduler: Any, *, warm_up: bool = False, timeout: float | None = None) -> Iterator[Any]:
    """Run ``scheduler.start()`` in a thread, which the block gets (for its CPU clock, say); stop it and join
    it (up to ``timeout`` seconds) on exit, and fail when it has not returned.  ``warm_up``: first run
    ``scheduler.warm_up_serving_thread()`` (here, before the thread starts)."""
    if warm_up:
        scheduler.warm_up_serving_thread()
    thread = threading.Thread(target=scheduler.start, name="scheduler-under-test", daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        scheduler.stop()
        thread.join(timeout)
        assert not thread.is_alive(), "start() did not return after stop()"


@contextmanager
def running(scheduler: Any, *, warm_up: bool = False, timeout: float | None = None) -> Iterator[Any]:
    """:func:`serving_thread`, the block getting ``scheduler``."""
    with serving_thread(scheduler, warm_up=warm_up, timeout=timeout):
        yield scheduler


def put_atomically(inbox: queue.Queue[Any], messages: list[Any]) -> None:
    """Hand a burst over the way the runtime does: one extend under the queue's lock."""
    with inbox.mutex:
        inbox.queue.extend(messages)
        inbox.unfinished_tasks += len(messages)
        inbox.not_empty.notify(len(messages))


def wait_results(scheduler: Any, count: int, *, timeout: float = 600) -> None:
    """Until ``count`` results came out of ``scheduler``; a ``RuntimeError`` naming the request on an error."""
    ended = 0
    while ended < count:
        msg = scheduler.outbox.get(timeout=timeout)
        if msg.type == "error":
            raise RuntimeError(f"{type(scheduler).__name__} failed {msg.request_id!r}: {msg.data}")
        ended += msg.type == "result"


__all__ = ["put_atomically", "running", "serving_thread", "wait_results"]
