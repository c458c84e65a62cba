"""Stage modules for the fork server's tests: each says where it was imported and where it runs.

``create_where(tag)`` adds ``{tag: {"imported_in", "pid", "ppid"}}`` to the payload: the process that
imported this module, the stage process, and its parent; ``create_announcing(fifo)`` builds it after
writing a line to the FIFO ``fifo`` (which waits until someone reads it).  Importing
:mod:`tests.fork_stages_cuda` maps a file whose name says ``libcuda.so`` (as a process that
initialised CUDA has one); importing :mod:`tests.fork_stages_thread` starts a thread: after either,
a process must not fork.
"""

from __future__ import annotations

import os
from pathlib import Path

from omnitrio.contract import StagePayload
from schedulers.simple import SimpleScheduler

F = "tests.fork_stages"

IMPORTED_IN = os.getpid()


def create_where(tag: str = "where") -> SimpleScheduler:
    def where(payload: StagePayload) -> StagePayload:
        payload.data = {**payload.data, tag: {"imported_in": IMPORTED_IN, "pid": os.getpid(), "ppid": os.getppid()}}
        return payload

    return SimpleScheduler(where)


def create_announcing(fifo: str, tag: str = "where") -> SimpleScheduler:
    Path(fifo).write_text("built\n")
    return create_where(tag)
