"""Stages in spawned OS processes: start-up, supervision, restart and shutdown.

``open_process_pipeline`` starts one process per distinct ``process`` name — a fresh
interpreter (spawn, never a fork of a process that may have touched CUDA) that reads
its spec from a pipe, so the caller's ``__main__`` is never re-imported — all in
parallel, and waits until each reports every stage ready.  A child that cannot import or build its
scheduler makes start-up fail with the child's traceback, leaving no process behind.

A child's death is seen at once — trio waits on its sentinel fd, nothing polls — and
every live request fails within milliseconds with ``RequestFailed`` naming the process
and its stages.  The process is restarted under ``restart="on-failure"`` (at most
``max_restarts`` times) on a fresh socket address, so nothing queued for the dead one
reaches the new one; later requests succeed.

Leaving the block — also on SIGINT/SIGTERM of the parent — stops every child within 5 s
(then kills it), removes the endpoint directory and every shared-memory segment of the
pipeline.  A child whose parent dies notices through a pidfd and exits.
"""

from __future__ import annotations

import json
import os
import pickle
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from omnitrio.bridge import LoopIdle
from omnitrio.config import PipelineConfig
from omnitrio.coordinator import Coordinator
from omnitrio.errors import RequestFailed, StartupError, collapse
from omnitrio.events import flush_periodically, recorder_from_env
from omnitrio.host import MAIN, Host
from omnitrio.pipeline import Pipeline, stage_health
from omnitrio.stage import Stage
from omnitrio.topology import Topology
from omnitrio.transport import wire
from omnitrio.transport.relay import remove_segments

STOP_GRACE = 5.0
HEALTH_TIMEOUT = 2.0


@attrs.frozen
class ChildSpec:
    """Everything a spawned stage process needs (pickled to the child)."""

    process: str
    config: PipelineConfig
    homes: dict[str, str]
    addresses: dict[str, str]
    shm_prefix: str
    parent_pid: int


@attrs.define(eq=False)
class Child:
    """The parent's view of one stage process."""

    name: str
    stages: list[str]
    process: trio.Process | None = None
    generation: int = 0
    restarts: int = 0
    alive: bool = False
    ready: trio.Event = attrs.field(factory=trio.Event)
    exited: trio.Event = attrs.field(factory=trio.Event)
    """Set by the reaper task when this generation's process has exited."""
    startup_error: str | None = None

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else 0

    @property
    def exit_code(self) -> int | None:
        return self.process.returncode if self.process is not None else None


class ProcessPipeline(Pipeline):
    """The pipeline API over stages in several processes."""

    def __init__(self, config: PipelineConfig, topology: Topology, base: str, prefix: str) -> None:
        self.topology = topology
        self._base = base
        self._prefix = prefix
        groups = topology.process_groups(inline=False)
        self.homes = {stage: (proc or MAIN) for proc, stages in groups.items() for stage in stages}
        self.children = {proc: Child(proc, stages) for proc, stages in groups.items() if proc is not None}
        addresses = {MAIN: self._address(MAIN, 0)}
        addresses.update({name: self._address(name, 0) for name in self.children})
        self.host = Host(MAIN, self.homes, addresses, f"{prefix}{MAIN}-", self._on_control)
        self._gauges: dict[str, dict[str, int]] = {}
        super().__init__(config, Coordinator(topology, self.host.send, topology.plans))
        self.host.coordinator = self.coordinator
        from omnitrio.runner import scheduler_builder

        for name, plan in topology.plans.items():
            if self.homes[name] == MAIN:
                self.host.stages[name] = Stage(plan, scheduler_builder(config, name), self.host, self.recorder)
        self._health_waiters: dict[int, tuple[trio.Event, dict[str, Any]]] = {}
        self._next_qid = 0
        self._closing = False
        self._nursery: trio.Nursery | None = None

    def _address(self, process: str, generation: int) -> str:
        if self.topology.config.transport == "zmq":
            return f"ipc://{self._base}/{process}-{generation}.sock"
        return f"unix:{self._base}/{process}-{generation}.sock"

    def _stage_gauges(self) -> dict[str, dict[str, int]]:
        gauges = dict(self._gauges)  # children's figures as of the last health() call
        for name, local in self.host.stages.items():
            gauges[name] = {"active_requests": local.active_requests, "queue_depth": local.queue_depth}
        return gauges

    async def health(self) -> dict[str, Any]:
        """Live request count and, per stage, alive / pid / process / active requests / restarts."""
        stages: dict[str, Any] = {}
        for name, local in self.host.stages.items():
            stages[name] = stage_health(True, os.getpid(), MAIN, local.active_requests, local.restarts)
        self._next_qid += 1
        qid = self._next_qid
        replies: dict[str, Any] = {}
        done = trio.Event()
        waiting = {c.name for c in self.children.values() if c.alive}
        self._health_waiters[qid] = (done, replies)
        for name in waiting:
            self.host.send_control(name, wire.HealthQuery(qid))
        with trio.move_on_after(HEALTH_TIMEOUT):
            while not waiting <= replies.keys():
                await done.wait()
                done = trio.Event()
                self._health_waiters[qid] = (done, replies)
        self._health_waiters.pop(qid, None)
        for child in self.children.values():
            reply = replies.get(child.name)
            pid = child.pid
            for stage in child.stages:
                active, stage_restarts, depth = reply.get(stage, (0, 0, 0)) if reply is not None else (0, 0, 0)
                self._gauges[stage] = {"active_requests": active, "queue_depth": depth}
                alive = child.alive and reply is not None
                stages[stage] = stage_health(alive, pid, child.name, active, child.restarts + stage_restarts)
        return {**self.request_health(), "stages": stages}

    # -- control messages from children -----------------------------------------------------

    def _on_control(self, src: str, message: Any) -> None:
        child = self.children.get(src)
        match message:
            case wire.Ready() if child is not None:
                child.alive = True
                child.ready.set()
            case wire.StartupFailed(error=error) if child is not None:
                child.startup_error = error
                child.ready.set()
            case wire.HealthReply(qid=qid, process=process, stages=stages):
                waiter = self._health_waiters.get(qid)
                if waiter is not None:
                    waiter[1][process] = {name: tuple(v) for name, v in stages.items()}
                    waiter[0].set()
            case _:
                return

    # -- children ------------------------------------------------------------------------

    async def _spawn(self, child: Child) -> None:
        """Start a fresh interpreter for ``child`` and hand it its spec through stdin."""
        assert self._nursery is not None
        child.ready = trio.Event()
        child.exited = trio.Event()
        child.startup_error = None
        spec = ChildSpec(child.name, self.config, self.homes, dict(self.host.addresses), self._prefix, os.getpid())
        env = dict(os.environ)
        env["OMNITRIO_PARENT_PID"] = str(os.getpid())  # which pipeline owns this process
        env.setdefault("OMP_NUM_THREADS", "1")  # a factory may raise it; 2 cores are shared by every process
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", "from omnitrio.processes import child_entry; child_entry()"],
            stdin=subprocess.PIPE,
            env=env,
        )
        assert process.stdin is not None
        await process.stdin.send_all(json.dumps(sys.path).encode() + b"\n" + pickle.dumps(spec))
        await process.stdin.aclose()
        child.process = process
        self._nursery.start_soon(_reap, process, child.exited)

    async def _wait_ready(self, child: Child, timeout: float) -> None:
        with trio.move_on_after(timeout) as scope:
            async with trio.open_nursery() as nursery:

                async def died() -> None:
                    await child.exited.wait()
                    await trio.sleep(0.05)  # its StartupFailed message may still be in flight
                    child.ready.set()

                nursery.start_soon(died)
                await child.ready.wait()
                nursery.cancel_scope.cancel()
        if child.startup_error is not None:
            raise StartupError(f"process {child.name!r} (stages {child.stages}) failed to start: {child.startup_error}")
        if scope.cancelled_caught:
            raise StartupError(f"process {child.name!r} did not start within {timeout:g} s (startup_timeout)")
        if not child.alive:
            raise StartupError(
                f"process {child.name!r} (stages {child.stages}) exited with code {child.exit_code} during start-up"
            )

    async def _supervise(self, child: Child) -> None:
        """Watch one child; on death fail its requests and restart it per policy."""
        while True:
            await child.exited.wait()
            if self._closing:
                return
            child.alive = False
            self._on_death(child, child.exit_code)
            if self.config.restart != "on-failure" or child.restarts >= self.config.max_restarts:
                return
            child.restarts += 1
            child.generation += 1
            self.host.addresses[child.name] = self._address(child.name, child.generation)
            await self._spawn(child)
            try:
                await self._wait_ready(child, self.config.startup_timeout)
            except StartupError:
                return
            address = self.host.addresses[child.name]
            self.host.peer_up(child.name, address)
            self.coordinator.stages_up(child.stages)
            for other in self.children.values():
                if other is not child and other.alive:
                    self.host.send_control(other.name, wire.PeerUp(child.name, address))

    def _on_death(self, child: Child, code: int | None) -> None:
        detail = f"process {child.name!r} (stages {', '.join(child.stages)}) died with exit code {code}"

        def error_for(request_id: str) -> RequestFailed:
            return RequestFailed(request_id, child.stages[0], "ProcessDied", detail)

        self.host.peer_down(child.name)
        remove_segments(f"{self._prefix}{child.name}-")
        for other in self.children.values():
            if other is not child and other.alive:
                self.host.send_control(other.name, wire.PeerDown(child.name))
        self.coordinator.stage_gone(child.stages, error_for)

    async def _stop_children(self) -> None:
        self._closing = True
        for child in self.children.values():
            if child.alive:
                self.host.send_control(child.name, wire.Shutdown())
        with trio.move_on_after(1.0):
            await self.host.flush()
        for child in self.children.values():
            process = child.process
            if process is None:
                continue
            with trio.move_on_after(STOP_GRACE):
                await child.exited.wait()
            if process.returncode is None:
                process.kill()
                with trio.move_on_after(2.0):
                    await child.exited.wait()


async def _reap(process: trio.Process, exited: trio.Event) -> None:
    """The one task that waits for a process (trio watches its pidfd)."""
    try:
        await process.wait()
    finally:
        exited.set()


@asynccontextmanager
async def open_process_pipeline(config: PipelineConfig) -> AsyncIterator[ProcessPipeline]:
    """Start a pipeline with stages in spawned processes; see the module docstring."""
    created_base = config.endpoints.base_path is None
    base = tempfile.mkdtemp(prefix="omnitrio-") if created_base else str(config.endpoints.base_path)
    os.makedirs(base, exist_ok=True)
    prefix = f"omnitrio-{os.getpid()}-{secrets.token_hex(4)}-"
    topology = Topology.compile(config)
    pipeline = ProcessPipeline(config, topology, base, prefix)
    try:
        async with trio.open_nursery() as nursery:
            pipeline._nursery = nursery
            await nursery.start(pipeline.host.run)
            if pipeline.recorder is not None:
                nursery.start_soon(flush_periodically, pipeline.recorder)
            try:
                for child in pipeline.children.values():
                    await pipeline._spawn(child)
                async with trio.open_nursery() as starting:
                    for stage in pipeline.host.stages.values():
                        starting.start_soon(nursery.start, stage.run)
                    for child in pipeline.children.values():
                        starting.start_soon(pipeline._wait_ready, child, config.startup_timeout)
                for child in pipeline.children.values():
                    nursery.start_soon(pipeline._supervise, child)
                yield pipeline
            finally:
                with trio.CancelScope(shield=True):
                    pipeline.coordinator.close()
                    await pipeline._stop_children()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        single = collapse(group)
        if single is group:
            raise
        raise single from single.__cause__
    finally:
        pipeline.host.close()
        if pipeline.recorder is not None:
            pipeline.recorder.close()
        remove_segments(prefix)
        if created_base:
            shutil.rmtree(base, ignore_errors=True)
        else:
            for name in os.listdir(base):
                if name.endswith(".sock"):
                    os.unlink(os.path.join(base, name))


# -- the child side ----------------------------------------------------------------------------


def child_entry() -> None:
    """``python -c`` entry of a stage process: read the parent's sys.path and the spec from stdin."""
    raw = sys.stdin.buffer.read()
    path, _, blob = raw.partition(b"\n")
    sys.path[:0] = [p for p in json.loads(path) if p not in sys.path]
    child_main(pickle.loads(blob))


def child_main(spec: ChildSpec) -> None:
    """Entry point of a spawned stage process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    sys.setswitchinterval(0.001)  # a Python-heavy scheduler thread must not stall the IO loop for 5 ms
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        trio.run(_child_run, spec)
    except BaseExceptionGroup as group:
        if isinstance(collapse(group), SystemExit):
            sys.exit(1)  # a start-up failure, already reported to the parent
        raise


async def _child_run(spec: ChildSpec) -> None:
    from omnitrio.runner import scheduler_builder

    shutdown = trio.Event()

    def on_control(src: str, message: Any) -> None:
        match message:
            case wire.Shutdown():
                shutdown.set()
            case wire.HealthQuery(qid=qid):
                stages = {name: [s.active_requests, s.restarts, s.queue_depth] for name, s in host.stages.items()}
                host.send_control(MAIN, wire.HealthReply(qid, spec.process, stages))
            case _:
                return

    host = Host(spec.process, spec.homes, spec.addresses, f"{spec.shm_prefix}{spec.process}-", on_control)
    recorder = recorder_from_env(spec.process)
    try:
        await _serve_child(spec, host, recorder, shutdown, scheduler_builder)
    finally:
        if recorder is not None:
            recorder.close()


async def _serve_child(spec: ChildSpec, host: Host, recorder: Any, shutdown: trio.Event, builder: Any) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(host.run)
        if recorder is not None:
            nursery.start_soon(flush_periodically, recorder)
        try:
            topology = Topology.compile(spec.config, [n for n, home in spec.homes.items() if home == spec.process])
            loop_idle = LoopIdle()
            trio.lowlevel.add_instrument(loop_idle)
            for name, plan in topology.plans.items():
                host.stages[name] = Stage(
                    plan,
                    builder(spec.config, name),
                    host,
                    recorder,
                    scheduler_nice=spec.config.scheduler_nice,
                    loop_idle=loop_idle,
                )
            async with trio.open_nursery() as starting:
                for stage in host.stages.values():
                    starting.start_soon(nursery.start, stage.run)
        except BaseException as exc:  # report why, then exit non-zero
            if isinstance(exc, trio.Cancelled):
                raise
            host.send_control(MAIN, wire.StartupFailed(spec.process, startup_report(exc)))
            with trio.move_on_after(2.0):
                await host.flush()
            nursery.cancel_scope.cancel()
            raise SystemExit(1) from None
        host.send_control(MAIN, wire.Ready(spec.process, os.getpid()))
        nursery.start_soon(_exit_with_parent, spec, shutdown)
        await shutdown.wait()
        nursery.cancel_scope.cancel()


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
