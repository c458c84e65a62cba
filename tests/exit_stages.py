"""Stages that leave something behind in their process at exit, for the tests of a stage process's exit.

Each answers a request with its payload.  ``create_lingering_thread`` starts a non-daemon thread that
never looks at any stop; ``create_blocking_finalizer`` keeps an object whose finalizer blocks for an
hour; ``create_temporary_directory`` keeps a :class:`tempfile.TemporaryDirectory` under ``base`` open,
which only an ``atexit`` hook removes.
"""

from __future__ import annotations

import tempfile
import threading
import time
from typing import Any

from schedulers.simple import SimpleScheduler

E = "tests.exit_stages"

KEPT: list[Any] = []
"""What the factories keep alive until the interpreter's teardown."""


class BlockingFinalizer:
    def __del__(self) -> None:
        time.sleep(3600)


def create_lingering_thread() -> SimpleScheduler:
    threading.Thread(target=threading.Event().wait, name="lingering", daemon=False).start()
    return SimpleScheduler(lambda payload: payload)


def create_blocking_finalizer() -> SimpleScheduler:
    KEPT.append(BlockingFinalizer())
    return SimpleScheduler(lambda payload: payload)


def create_temporary_directory(base: str) -> SimpleScheduler:
    KEPT.append(tempfile.TemporaryDirectory(dir=base))
    return SimpleScheduler(lambda payload: payload)
