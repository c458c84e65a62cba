"""A stage process: what runs inside one spawned interpreter of a pipeline.

The parent (:mod:`omnitrio.children`) starts :data:`ENTRY` with ``python -c`` and writes its
``sys.path`` and a pickled :class:`ChildSpec` to the child's stdin, so the caller's ``__main__``
is never re-imported (or has :mod:`omnitrio.forkserver` fork one that runs :func:`main`).  The
child builds its stages, then sends ``Ready`` — or ``StartupFailed`` with its traceback, and
exits non-zero.  It
serves until the parent sends ``Shutdown``, or until the parent process is gone (its
pidfd becomes readable) — both also while it is still starting: an orphan removes the
pipeline's shared memory and socket directory on its way out.

Once its stages have stopped and its sockets and shared memory are gone, a child leaves at
once (:func:`leave`): its ``atexit`` hooks run (logging's flush, finalizers such as a
temporary directory's), then ``os._exit``.  It never waits for threads still running (a
scheduler that outlived its ``scheduler_stop_timeout``, a pool worker mid-compute) nor for
the interpreter's teardown, which frees torch, transformers and the models module by module
at a cost of CPU seconds that, on a loaded machine, can outlast the parent's stop grace.
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import shutil
import signal
import sys
import time
import traceback
from typing import NoReturn

import attrs
import trio

from omnitrio.bridge import LoopIdle
from omnitrio.config import PipelineConfig
from omnitrio.errors import ConfigError, StartupError, collapse
from omnitrio.events import (
    PROCESS_FACTORIES_IMPORTED,
    PROCESS_INTERPRETER_UP,
    PROCESS_LISTENING,
    PROCESS_READY,
    PROCESS_RUNTIME_IMPORTED,
    flush_periodically,
    recorder_from_env,
)
from omnitrio.factory import build_stages, start_stages
from omnitrio.health import Figures
from omnitrio.replicas import Replicas
from omnitrio.stage import Stage
from omnitrio.switchboard import Switchboard
from omnitrio.topology import MAIN, Topology
from omnitrio.transport import wire
from omnitrio.transport.relay import remove_segments

ENTRY = "import time; t = time.monotonic_ns(); from omnitrio.child import entry; entry(t)"
"""The ``python -c`` program the parent starts (``t``: when the interpreter ran its first line)."""


@attrs.frozen
class ChildSpec:
    """Everything a stage process needs (pickled to the child)."""

    process: str
    config: PipelineConfig
    homes: dict[str, str]
    addresses: dict[str, str]
    shm_prefix: str
    parent_pid: int
    """0 when no parent process is watched (a Ray actor: Ray ends it with its owner)."""


def entry(interpreter_up_ns: int) -> None:
    """``python -c`` entry: read the parent's sys.path and the spec from stdin, then serve."""
    imported_ns = time.monotonic_ns()
    raw = sys.stdin.buffer.read()
    path, _, blob = raw.partition(b"\n")
    sys.path[:0] = [p for p in json.loads(path) if p not in sys.path]
    leave(main(pickle.loads(blob), (interpreter_up_ns, imported_ns)))


def main(spec: ChildSpec, began: tuple[int, int] | None = None) -> int:
    """Serve ``spec.process``'s stages until told to stop; the exit status: 0 once stopped, 1 after
    a start-up failure (already reported to the parent).  Scheduler threads left behind (see
    :mod:`omnitrio.bridge`) may still run when it returns.

    ``began``: when this process's interpreter ran its first line and when it had imported the
    runtime (``time.monotonic_ns()``), for its start-up events."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    sys.setswitchinterval(0.001)  # a Python-heavy scheduler thread must not stall the IO loop for 5 ms
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        trio.run(_serve, spec, began)
    except BaseExceptionGroup as group:
        if isinstance(collapse(group), SystemExit):
            return 1
        raise
    return 0


def leave(code: int) -> NoReturn:
    """End this stage process now: run the ``atexit`` hooks, flush stdio, ``os._exit(code)``.

    Only for a process whose pipeline state is already released (see the module docstring).
    """
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


async def _serve(spec: ChildSpec, began: tuple[int, int] | None) -> None:
    """Serve until told to stop."""
    replicas = Replicas.of(spec.config.processes, spec.homes)
    board = Switchboard(spec.process, spec.homes, replicas)
    stages: dict[str, Stage] = {}
    shutdown = trio.Event()

    async def answer_control() -> None:
        async for _, message in board.control:
            match message:
                case wire.Shutdown():
                    shutdown.set()
                case wire.HealthQuery(qid=qid):
                    figures = {name: Figures.of(s) for name, s in stages.items()}
                    counts = {name: f.to_wire() for name, f in figures.items()}
                    dead = {name: f.dead for name, f in figures.items() if f.dead is not None}
                    board.send_control(MAIN, wire.HealthReply(qid, spec.process, counts, dead))
                case _:
                    pass

    recorder = recorder_from_env(spec.process)
    if recorder is not None and began is not None:
        recorder.emit_at(began[0], None, None, PROCESS_INTERPRETER_UP)
        recorder.emit_at(began[1], None, None, PROCESS_RUNTIME_IMPORTED)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(board.run)
            nursery.start_soon(answer_control)
            nursery.start_soon(_exit_with_parent, spec, shutdown)
            nursery.start_soon(_stop_when, shutdown, nursery.cancel_scope)  # also while still starting
            own = await board.listen(spec.addresses[spec.process], f"{spec.shm_prefix}{spec.process}-")
            for process, address in spec.addresses.items():
                if process != spec.process:
                    board.peer_up(process, address)
            if recorder is not None:
                recorder.emit(None, None, PROCESS_LISTENING)
                nursery.start_soon(flush_periodically, recorder)
            try:
                mine = replicas.stages_in(board.group)
                loop_idle = LoopIdle()
                trio.lowlevel.add_instrument(loop_idle)
                plans = Topology.compile(spec.config, mine).plans
                options = {"scheduler_nice": spec.config.scheduler_nice, "loop_idle": loop_idle}
                stages.update(build_stages(plans, spec.config, board, recorder, **options))
                if recorder is not None:
                    recorder.emit(None, None, PROCESS_FACTORIES_IMPORTED)
                await start_stages(nursery, stages.values())
                if any(getattr(stage.scheduler, "warmed", ()) for stage in stages.values()):
                    await board.prepare_shared_memory()  # a model stage's process: its first send is warm too
            except BaseException as exc:  # report why, then exit non-zero
                if isinstance(exc, trio.Cancelled) or shutdown.is_set():
                    raise
                board.send_control(MAIN, startup_failed(spec.process, exc))
                with trio.move_on_after(2.0):
                    await board.flush()
                nursery.cancel_scope.cancel()
                raise SystemExit(1) from None
            board.send_control(MAIN, wire.Ready(spec.process, os.getpid(), own))
            if recorder is not None:
                recorder.emit(None, None, PROCESS_READY, process=spec.process)
            await trio.sleep_forever()
    finally:
        if recorder is not None:
            recorder.close()


async def _stop_when(shutdown: trio.Event, scope: trio.CancelScope) -> None:
    await shutdown.wait()
    scope.cancel()


def startup_failed(process: str, exc: BaseException) -> wire.StartupFailed:
    """What to tell the parent: a config error as its one line, anything else with its traceback."""
    error = collapse(exc) if isinstance(exc, BaseExceptionGroup) else exc
    if isinstance(error, ConfigError):
        return wire.StartupFailed(process, str(error), config_error=True)
    return wire.StartupFailed(process, startup_report(exc))


def startup_report(exc: BaseException) -> str:
    """One line naming what failed to start, then the traceback of what raised it (a factory's, not ours)."""
    error = collapse(exc) if isinstance(exc, BaseExceptionGroup) else exc
    match error:
        case StartupError(__cause__=BaseException() as cause):
            return f"{error}\n" + "".join(traceback.format_exception(cause))
        case _:
            return f"{type(error).__name__}: {error}\n" + "".join(traceback.format_exception(error))


async def _exit_with_parent(spec: ChildSpec, shutdown: trio.Event) -> None:
    """Stop when the parent process is gone (its pidfd becomes readable).

    A parent killed without cleaning up (SIGKILL, an unhandled SIGTERM) leaves its shared
    memory and socket directory behind: the orphaned children remove them on their way out.
    """
    if spec.parent_pid == 0:
        return
    try:
        fd = os.pidfd_open(spec.parent_pid)
    except OSError:
        fd = -1
    if fd >= 0:
        try:
            await trio.lowlevel.wait_readable(fd)
        finally:
            os.close(fd)
    remove_segments(spec.shm_prefix)
    own = spec.addresses.get(spec.process, "")
    base = os.path.dirname(own.split(":", 1)[-1].removeprefix("//"))
    if base and os.path.basename(base).startswith("omnitrio-"):
        shutil.rmtree(base, ignore_errors=True)
    shutdown.set()
