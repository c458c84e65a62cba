"""The stage processes of a pipeline, from the caller's side: spawn, ready, watch, restart, stop.

``async with open_children(...) as children`` starts one process per distinct ``process``
name of the config (``replicas`` of them for a replicated group: :mod:`omnitrio.replicas`)
running :mod:`omnitrio.child` — never a fork of the caller, which may have touched CUDA —
and :meth:`Children.wait_ready` waits until each reports every stage ready.  Each process is
a fork of the pipeline's fork server (:mod:`omnitrio.forkserver`), which imported the stage
factories' modules once; when the server will not fork (or with ``OMNITRIO_START_METHOD=spawn``
in the environment) each is a fresh interpreter instead.  A child that cannot import or build its scheduler makes
that wait raise :class:`StartupError` with the child's traceback.

A child's death is seen at once — trio waits on its pidfd (for a Ray actor, Ray reports
it), and over zmq the parent's connection to it reports the drop too: whichever comes
first counts, nothing polls.  A child whose connection drops is killed.  Every live
request bound to it fails within milliseconds with ``RequestFailed`` naming the process
and its stages (a replica's death fails no other replica's requests).  The process is
restarted under ``restart="on-failure"`` (at most ``max_restarts`` times) on a fresh
socket address, so nothing queued for the dead one reaches the new one; later requests
succeed.

Leaving the block — also on SIGINT/SIGTERM of the parent — stops every child within
:data:`STOP_GRACE` seconds plus the longest ``scheduler_stop_timeout`` of its stages (then
kills it) and removes the endpoint directory and every shared-memory segment of the pipeline.
With no ``process`` names there are no children, no sockets and no shared memory.

With ``placement = "ray"`` each process group is a Ray actor instead
(:mod:`omnitrio.placement`), placed with the resources ``config.processes`` names and
watched the same way: every process listens on a TCP port of its own choosing on its
node's address and says which in its ``Ready`` message; the parent then connects the
groups to each other.  Tensors use shared memory between processes of one node only.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Protocol

import attrs
import trio

from omnitrio.child import ENTRY, ChildSpec
from omnitrio.config import PipelineConfig
from omnitrio.errors import ConfigError, RequestError, RequestFailed, StartupError
from omnitrio.events import PROCESS_READY, PROCESS_SPAWNED, EventRecorder
from omnitrio.forkserver import ForkedProcess, ForkServer, open_fork_server, preload_modules
from omnitrio.health import Figures, gauges, replicated_entry, stage_entry
from omnitrio.placement.actors import ActorProcess, start_actor
from omnitrio.placement.cluster import open_ray_cluster
from omnitrio.start_method import child_environment, forking
from omnitrio.switchboard import UNIX, Switchboard
from omnitrio.topology import MAIN
from omnitrio.transport import wire
from omnitrio.transport.relay import remove_segments

log = logging.getLogger(__name__)

STOP_GRACE = 5.0
HEALTH_TIMEOUT = 2.0


class ProcessEvents(Protocol):
    """Who hears of a stage process going down and coming back (the coordinator; the runner wires it)."""

    def process_gone(self, process: str, error_for: Callable[[str], RequestError]) -> None:
        """``process`` died: fail what is bound to it; ``error_for(request_id)`` is the error."""

    def process_up(self, process: str) -> None:
        """A restarted ``process`` takes requests again."""


@attrs.define(eq=False)
class _Child:
    """One stage process and its current generation."""

    name: str
    group: str
    stages: list[str]
    process: trio.Process | ActorProcess | ForkedProcess | None = None
    generation: int = 0
    restarts: int = 0
    alive: bool = False
    ready: trio.Event = attrs.field(factory=trio.Event)
    exited: trio.Event = attrs.field(factory=trio.Event)
    """Set by the reaper task when this generation's process has exited."""
    startup_error: str | None = None
    startup_config_error: bool = False
    """The start-up error is a config error of one of its stages (a factory's arguments)."""

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else 0

    @property
    def exit_code(self) -> int | None:
        return self.process.returncode if self.process is not None else None


@attrs.frozen
class _Endpoints:
    """Where a pipeline's processes listen and name their shared memory."""

    base: str
    created: bool
    prefix: str
    transport: str
    host: str = ""
    """With Ray placement: this node's address; every process listens on a TCP port it picks."""

    @classmethod
    def create(cls, config: PipelineConfig, host: str = "") -> _Endpoints:
        created = config.endpoints.base_path is None
        base = tempfile.mkdtemp(prefix="omnitrio-") if created else str(config.endpoints.base_path)
        os.makedirs(base, exist_ok=True)
        return cls(base, created, f"omnitrio-{os.getpid()}-{secrets.token_hex(4)}-", config.transport, host)

    def address(self, process: str, generation: int) -> str:
        if self.host:
            return f"tcp://{self.host}:*"
        if self.transport == "zmq":
            return f"ipc://{self.base}/{process}-{generation}.sock"
        return f"{UNIX}{self.base}/{process}-{generation}.sock"

    def remove(self) -> None:
        """Unlink every shared-memory segment and socket of the pipeline."""
        remove_segments(self.prefix)
        if self.created:
            shutil.rmtree(self.base, ignore_errors=True)
            return
        for name in os.listdir(self.base):
            if name.endswith(".sock"):
                os.unlink(os.path.join(self.base, name))


class Children:
    """The parent's side of every stage process; made by :func:`open_children`."""

    def __init__(
        self,
        config: PipelineConfig,
        homes: dict[str, str],
        board: Switchboard,
        events: ProcessEvents,
        endpoints: _Endpoints | None,
        nursery: trio.Nursery | None,
        watchers: trio.Nursery | None,
        ray: Any = None,
        forks: ForkServer | None = None,
        recorder: EventRecorder | None = None,
    ) -> None:
        """``nursery`` holds the reapers, ``watchers`` the supervisors (cancelled first on exit)."""
        self._config = config
        self._ray = ray
        self._forks = forks
        self._recorder = recorder
        self._homes = homes
        self._board = board
        self._events = events
        self._endpoints = endpoints
        self._nursery = nursery
        self._watchers = watchers
        self._children: dict[str, _Child] = {}
        for group in dict.fromkeys(home for home in homes.values() if home != MAIN):
            for name in board.replicas.processes(group):
                self._children[name] = _Child(name, group, board.replicas.stages_in(group))
        self._addresses = {name: self._address(name, 0) for name in (MAIN, *self._children)} if endpoints else {}
        self._gauges: dict[str, dict[str, Any]] = {}
        self._health_waiters: dict[int, tuple[trio.Event, dict[str, Any]]] = {}
        self._next_qid = 0

    def _address(self, process: str, generation: int) -> str:
        assert self._endpoints is not None
        return self._endpoints.address(process, generation)

    # -- what the pipeline asks ----------------------------------------------------------

    async def wait_ready(self) -> None:
        """Wait until every child has started all its stages, then watch each one.

        Raises :class:`StartupError` naming the child (with its traceback) when one fails, or the
        :class:`ConfigError` of a stage whose factory the child found not to accept its arguments.
        """
        async with trio.open_nursery() as starting:
            if MAIN in self._homes.values():  # main's stages send to the children: its first send is warm too
                starting.start_soon(self._board.prepare_shared_memory)
            for child in self._children.values():
                starting.start_soon(self._wait_ready, child, self._config.startup_timeout)
        for child in self._children.values():
            assert self._watchers is not None
            self._watchers.start_soon(self._supervise, child)

    def gauges(self) -> dict[str, dict[str, Any]]:
        """Per child stage ``{"active_requests", "queue_depth"}`` as of the last :meth:`health`;
        a replicated stage's are summed, with ``"replicas"``: the same per replica process."""
        return dict(self._gauges)

    async def health(self) -> dict[str, dict[str, Any]]:
        """Ask every live child (at most :data:`HEALTH_TIMEOUT`); per child stage its health entry.

        A child that does not answer in time is reported not alive.  Also refreshes :meth:`gauges`.
        """
        if not self._children:
            return {}
        self._next_qid += 1
        qid = self._next_qid
        replies: dict[str, Any] = {}
        done = trio.Event()
        waiting = {c.name for c in self._children.values() if c.alive}
        self._health_waiters[qid] = (done, replies)
        for name in waiting:
            self._board.send_control(name, wire.HealthQuery(qid))
        with trio.move_on_after(HEALTH_TIMEOUT):
            while not waiting <= replies.keys():
                await done.wait()
                done = trio.Event()
                self._health_waiters[qid] = (done, replies)
        self._health_waiters.pop(qid, None)
        entries: dict[str, list[dict[str, Any]]] = {}
        figures: dict[str, dict[str, Figures]] = {}
        for child in self._children.values():
            reply = replies.get(child.name)
            for stage in child.stages:
                found = reply.get(stage, Figures()) if reply is not None else Figures()
                figures.setdefault(stage, {})[child.name] = found
                alive = child.alive and reply is not None
                entries.setdefault(stage, []).append(stage_entry(alive, child.pid, child.name, found, child.restarts))
        self._gauges.update({stage: gauges(per_process) for stage, per_process in figures.items()})
        return {stage: replicated_entry(self._board.homes[stage], found) for stage, found in entries.items()}

    # -- control messages from children -----------------------------------------------------

    async def _take_control(self) -> None:
        """Handle what the children report (the board's :attr:`~Switchboard.control`), in order."""
        async for src, message in self._board.control:
            child = self._children.get(src)
            match message:
                case wire.Ready(address=address) if child is not None:
                    if self._recorder is not None:
                        self._recorder.emit(None, None, PROCESS_READY, process=child.name)
                    child.alive = True
                    if self._ray is not None:
                        self._joined(child, address)
                    child.ready.set()
                case wire.StartupFailed(error=error, config_error=config_error) if child is not None:
                    child.startup_error = error
                    child.startup_config_error = config_error
                    child.ready.set()
                case wire.HealthReply(qid=qid, process=process, stages=stages, dead=dead):
                    waiter = self._health_waiters.get(qid)
                    if waiter is not None:
                        waiter[1][process] = {name: Figures.from_wire(v, dead.get(name)) for name, v in stages.items()}
                        waiter[0].set()
                case _:
                    pass

    # -- one child's life -------------------------------------------------------------------

    async def _start(self) -> None:
        """Listen, connect to every child's address and spawn the children."""
        assert self._endpoints is not None and self._nursery is not None
        self._nursery.start_soon(self._take_control)
        main = await self._board.listen(self._addresses[MAIN], f"{self._endpoints.prefix}{MAIN}-")
        self._addresses[MAIN] = main
        for name, address in self._addresses.items():
            if name != MAIN and self._ray is None:
                self._board.peer_up(name, address)
        async with trio.open_nursery() as spawning:  # placing Ray actors takes seconds each
            for child in self._children.values():
                spawning.start_soon(self._spawn, child)

    async def _spawn(self, child: _Child) -> None:
        """Start a fresh interpreter for ``child`` and hand it its spec through stdin (or,
        with ``placement = "ray"``, place it as a Ray actor that runs the same entry)."""
        assert self._nursery is not None and self._endpoints is not None
        child.ready = trio.Event()
        child.exited = trio.Event()
        child.startup_error = None
        prefix = self._endpoints.prefix
        spec = ChildSpec(child.name, self._config, self._homes, dict(self._addresses), prefix, os.getpid())
        if self._ray is not None:
            spec = attrs.evolve(spec, addresses={MAIN: self._addresses[MAIN]})
            resources = self._config.resources(child.group)
            self._spawned(child, "ray", time.monotonic_ns())
            child.process = await start_actor(self._ray, spec, resources, self._config.startup_timeout)
            self._nursery.start_soon(_reap, child.process, child.exited)
            return
        asked_ns = time.monotonic_ns()
        needs = preload_modules(self._config.stage(name).factory_path for name in child.stages)
        forked = await self._forks.start(spec, needs) if self._forks is not None else None
        if forked is not None:
            self._spawned(child, "forkserver", asked_ns)
            child.process = forked
            self._nursery.start_soon(_reap, forked, child.exited)
            return
        self._spawned(child, "spawn", asked_ns)
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", ENTRY], stdin=subprocess.PIPE, env=child_environment()
        )
        assert process.stdin is not None
        await process.stdin.send_all(json.dumps(sys.path).encode() + b"\n" + pickle.dumps(spec))
        await process.stdin.aclose()
        child.process = process
        self._nursery.start_soon(_reap, process, child.exited)

    def _spawned(self, child: _Child, how: str, t_ns: int) -> None:
        if self._recorder is not None:
            self._recorder.emit_at(t_ns, None, None, PROCESS_SPAWNED, process=child.name, how=how)

    async def _wait_ready(self, child: _Child, timeout: float) -> None:
        with trio.move_on_after(timeout) as scope:
            async with trio.open_nursery() as nursery:

                async def died() -> None:
                    await child.exited.wait()
                    await trio.sleep(0.05)  # its StartupFailed message may still be in flight
                    child.ready.set()

                nursery.start_soon(died)
                await child.ready.wait()
                nursery.cancel_scope.cancel()
        if child.startup_error is not None and child.startup_config_error:
            raise ConfigError(child.startup_error)
        if child.startup_error is not None:
            raise StartupError(f"process {child.name!r} (stages {child.stages}) failed to start: {child.startup_error}")
        if scope.cancelled_caught:
            raise StartupError(f"process {child.name!r} did not start within {timeout:g} s (startup_timeout)")
        if not child.alive:
            raise StartupError(
                f"process {child.name!r} (stages {child.stages}) exited with code {child.exit_code} during start-up"
            )

    async def _supervise(self, child: _Child) -> None:
        """Watch one child; on death fail its requests and restart it per policy."""
        config = self._config
        while True:
            how = await self._until_gone(child)
            child.alive = False
            self._on_death(child, how)
            if child.exit_code is None and child.process is not None:
                child.process.kill()
                await child.exited.wait()
            if config.restart != "on-failure" or child.restarts >= config.max_restarts:
                return
            child.restarts += 1
            child.generation += 1
            address = self._addresses[child.name] = self._address(child.name, child.generation)
            await self._spawn(child)
            try:
                await self._wait_ready(child, config.startup_timeout)
            except (StartupError, ConfigError):
                return
            if self._ray is None:  # a Ray-placed group said where it listens in its Ready message
                self._board.peer_up(child.name, address)
                self._tell_others(child, wire.PeerUp(child.name, address))
            self._events.process_up(child.name)

    async def _until_gone(self, child: _Child) -> str:
        """Wait until ``child`` exits or the connection to it drops; say which, as "died …" ends."""
        how = ""
        async with trio.open_nursery() as race:

            async def connection() -> None:
                nonlocal how
                await self._board.lost(child.name)
                how = "(its connection closed)"
                race.cancel_scope.cancel()

            race.start_soon(connection)
            await child.exited.wait()
            race.cancel_scope.cancel()
        return how or f"with exit code {child.exit_code}"

    def _on_death(self, child: _Child, how: str) -> None:
        detail = f"process {child.name!r} (stages {', '.join(child.stages)}) died {how}"

        def error_for(request_id: str) -> RequestFailed:
            return RequestFailed(request_id, child.stages[0], "ProcessDied", detail)

        assert self._endpoints is not None
        self._board.peer_down(child.name)
        remove_segments(f"{self._endpoints.prefix}{child.name}-")
        self._tell_others(child, wire.PeerDown(child.name))
        self._events.process_gone(child.name, error_for)

    def _joined(self, child: _Child, address: str) -> None:
        """A Ray-placed group listens on ``address``: connect to it, and it and the live groups to each other."""
        self._addresses[child.name] = address
        self._board.peer_up(child.name, address)
        self._tell_others(child, wire.PeerUp(child.name, address))
        for other in self._children.values():
            if other is not child and other.alive:
                self._board.send_control(child.name, wire.PeerUp(other.name, self._addresses[other.name]))

    def _tell_others(self, child: _Child, message: wire.PeerUp | wire.PeerDown) -> None:
        for other in self._children.values():
            if other is not child and other.alive:
                self._board.send_control(other.name, message)

    async def _stop(self) -> None:
        for child in self._children.values():  # one still starting stops too
            if child.process is not None and not child.exited.is_set():
                self._board.send_control(child.name, wire.Shutdown())
        with trio.move_on_after(1.0):
            await self._board.flush()
        for child in self._children.values():
            process = child.process
            if process is None:
                continue
            grace = STOP_GRACE + max(self._config.stage(name).scheduler_stop_timeout for name in child.stages)
            with trio.move_on_after(grace):
                await child.exited.wait()
            if process.returncode is None:
                log.warning(
                    "process %r (stages %s) did not exit within %g s of shutdown; killed it",
                    child.name,
                    child.stages,
                    grace,
                )
                process.kill()
                with trio.move_on_after(2.0):
                    await child.exited.wait()


def _fork_server_wanted(config: PipelineConfig, homes: dict[str, str]) -> list[str] | None:
    """What the fork server preloads for this pipeline, or None when its processes are spawned."""
    if not forking():
        return None
    return preload_modules(config.stage(name).factory_path for name, home in homes.items() if home != MAIN)


async def _reap(process: trio.Process | ActorProcess | ForkedProcess, exited: trio.Event) -> None:
    """The one task that waits for a process (trio watches its pidfd; Ray, an actor)."""
    try:
        await process.wait()
    finally:
        exited.set()


@asynccontextmanager
async def open_children(
    config: PipelineConfig,
    homes: dict[str, str],
    board: Switchboard,
    events: ProcessEvents,
    recorder: EventRecorder | None = None,
) -> AsyncIterator[Children]:
    """Spawn a process for every ``process`` name in ``homes``; stop them all on exit.

    ``board`` (running) is made to listen and connect to every child; the children are
    spawned on entry and may still be starting: call :meth:`Children.wait_ready`.
    ``events`` hears when a child goes down and comes back up; ``recorder`` gets the
    start-up events of the caller's side.
    """
    if all(home == MAIN for home in homes.values()):
        yield Children(config, homes, board, events, None, None, None)
        return
    async with AsyncExitStack() as stack:
        ray = host = forks = None
        if config.placement == "ray":
            ray = await stack.enter_async_context(open_ray_cluster(config.ray_address))
            host = ray.util.get_node_ip_address()
        elif (preload := _fork_server_wanted(config, homes)) is not None:
            forks = await stack.enter_async_context(open_fork_server(preload, child_environment(), recorder))
        endpoints = _Endpoints.create(config, host or "")
        stack.callback(endpoints.remove)
        async with trio.open_nursery() as nursery, trio.open_nursery() as watchers:
            children = Children(config, homes, board, events, endpoints, nursery, watchers, ray, forks, recorder)
            try:
                await children._start()
                yield children
            finally:
                watchers.cancel_scope.cancel()  # children exiting from here on are being stopped
                with trio.CancelScope(shield=True):
                    await children._stop()
                nursery.cancel_scope.cancel()
