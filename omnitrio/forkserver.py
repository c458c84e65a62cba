"""A fork server for a pipeline's stage processes: the heavy modules imported once, every process a fork.

``async with open_fork_server(preload, env) as server`` starts a fresh interpreter
(:mod:`omnitrio.forkserver_main` — never a fork of the caller, which may have touched CUDA) that
imports the ``preload`` modules (the factory modules of the pipeline's stage processes, and so
torch, transformers and the model code) while the caller goes on starting.  :meth:`ForkServer.start`
waits until that import is done, then has the server fork a stage process that runs
:func:`omnitrio.child.main` for the spec, and returns it as a :class:`ForkedProcess`: a process the
caller watches, waits for and kills like a ``trio.Process`` (through a pidfd, so a pid reused after
the process has gone is never signalled).  Forking costs milliseconds where a fresh interpreter
would import everything again, on the same cores as its siblings.

:meth:`~ForkServer.start` returns None when there is no server to fork from: it refused after its
import (it touched CUDA or runs threads of its own, see :mod:`omnitrio.forkserver_main`; logged
once, with why) or it is gone.  The caller then starts a fresh interpreter instead.

Leaving the block closes the server's socket: the server exits (its forks, the stage processes,
live on until they are stopped).  A stage process the server forked reports its exit status
through the server; if the server has gone, :attr:`ForkedProcess.returncode` of a process that
exits afterwards is :data:`UNKNOWN_EXIT`.
"""

from __future__ import annotations

import array
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from omnitrio.events import FORK_SERVER_PRELOADED, FORK_SERVER_UP, EventRecorder
from omnitrio.forkserver_main import ENTRY, HEADER, pack, unpack_length

log = logging.getLogger(__name__)

UNKNOWN_EXIT = 255
"""The exit status of a forked process that exited after its server had gone."""


@attrs.define(eq=False)
class ForkedProcess:
    """A stage process the fork server forked: ``pid``, ``returncode``, ``wait()``, ``kill()``."""

    pid: int
    pidfd: int
    returncode: int | None = None
    reported: trio.Event = attrs.field(factory=trio.Event)
    """Set when the server has reported the exit status (or has gone)."""

    async def wait(self) -> int:
        """Wait until the process has exited; its exit status."""
        try:
            await trio.lowlevel.wait_readable(self.pidfd)
            await self.reported.wait()
        finally:
            if self.returncode is None:
                self.returncode = UNKNOWN_EXIT
            self._close()
        return self.returncode

    def kill(self) -> None:
        """SIGKILL the process, unless it is known to have exited."""
        if self.pidfd >= 0:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _close(self) -> None:
        if self.pidfd >= 0:
            trio.lowlevel.notify_closing(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = -1


class ForkServer:
    """The caller's side of one fork server; made by :func:`open_fork_server`."""

    def __init__(self, process: trio.Process, sock: trio.socket.SocketType, recorder: EventRecorder | None) -> None:
        self._process = process
        self._sock = sock
        self._recorder = recorder
        self._sending = trio.Lock()
        self._ready = trio.Event()
        self.refused: str | None = None
        """Why the server will fork nothing (None while it can)."""
        self._forks: dict[int, tuple[trio.Event, list[ForkedProcess]]] = {}
        self._live: dict[int, ForkedProcess] = {}
        self._next_seq = 0

    async def start(self, spec: Any) -> ForkedProcess | None:
        """Fork a stage process serving ``spec`` (a :class:`~omnitrio.child.ChildSpec`), or None (module
        docstring).  Waits for the server's preload first."""
        await self._ready.wait()
        if self.refused is not None:
            return None
        self._next_seq += 1
        seq = self._next_seq
        done, forked = self._forks[seq] = (trio.Event(), [])
        try:
            await self._send(("fork", seq, pickle.dumps(spec)))
        except OSError:
            self._gone("its socket closed")
        await done.wait()
        return forked[0] if forked else None

    async def _send(self, message: tuple[Any, ...]) -> None:
        data = pack(message)
        async with self._sending:
            while data:
                sent = await self._sock.send(data)
                data = data[sent:]

    async def _read(self) -> None:
        """Take the server's messages until it is gone."""
        try:
            while True:
                message, fds = await self._receive()
                match message:
                    case ("ready", dict() as failed, int() as up_ns, int() as preloaded_ns):
                        for module, why in failed.items():
                            log.debug("fork server: could not preload %s: %s", module, why)
                        if self._recorder is not None:
                            self._recorder.emit_at(up_ns, None, None, FORK_SERVER_UP)
                            self._recorder.emit_at(preloaded_ns, None, None, FORK_SERVER_PRELOADED, failed=len(failed))
                        self._ready.set()
                    case ("refused", str() as why):
                        log.info("stage processes start as fresh interpreters: the fork server refused, %s", why)
                        self._gone(why)
                    case ("forked", int() as seq, int() as pid):
                        process = self._live[pid] = ForkedProcess(pid, fds[0])
                        done, forked = self._forks.pop(seq)
                        forked.append(process)
                        done.set()
                    case ("exited", int() as pid, int() as code):
                        process = self._live.pop(pid)
                        process.returncode = code
                        process.reported.set()
        except (EOFError, OSError):
            self._gone("it exited")

    def _gone(self, why: str) -> None:
        if self.refused is None:
            self.refused = why
        self._ready.set()
        for done, _ in self._forks.values():
            done.set()
        self._forks.clear()
        for process in self._live.values():
            process.reported.set()

    async def _receive(self) -> tuple[Any, list[int]]:
        """One message from the server, and the file descriptors that came with it."""
        fds: list[int] = []
        header = b""
        while len(header) < HEADER.size:
            data, ancdata, _, _ = await self._sock.recvmsg(HEADER.size - len(header), socket.CMSG_SPACE(4))
            if not data:
                raise EOFError
            header += data
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds += array.array("i", payload[: len(payload) - len(payload) % 4]).tolist()
        size = unpack_length(header)
        body = b""
        while len(body) < size:
            chunk = await self._sock.recv(size - len(body))
            if not chunk:
                raise EOFError
            body += chunk
        return pickle.loads(body), fds


def preload_modules(paths: Iterable[str]) -> list[str]:
    """The modules a fork server preloads for the dotted ``paths`` a config names (each once)."""
    modules = ["omnitrio.child"]
    for path in paths:
        module = path.partition(":")[0] if ":" in path else path.rpartition(".")[0]
        if module and module not in modules:
            modules.append(module)
    return modules


@asynccontextmanager
async def open_fork_server(
    preload: list[str], env: dict[str, str], recorder: EventRecorder | None = None
) -> AsyncIterator[ForkServer]:
    """Start a fork server preloading ``preload`` with ``env``; stop it on exit (module docstring).

    ``recorder`` gets its start-up events."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        command = [sys.executable, "-c", ENTRY.format(fd=theirs.fileno())]
        process = await trio.lowlevel.open_process(
            command, pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL
        )
        theirs.close()
        sock = trio.socket.from_stdlib_socket(ours)
        server = ForkServer(process, sock, recorder)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(server._read)
                await server._send(("preload", sys.path, preload))
                yield server
                nursery.cancel_scope.cancel()
        finally:
            sock.close()
            with trio.move_on_after(5.0) as waiting:
                waiting.shield = True
                await process.wait()
            if process.returncode is None:
                process.kill()
