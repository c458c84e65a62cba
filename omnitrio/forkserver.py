"""A fork server for a pipeline's stage processes: the heavy modules imported once, every process a fork.

``async with open_fork_server(preload, env) as server`` starts a fresh interpreter
(:mod:`omnitrio.forkserver_main` — never a fork of the caller, which may have touched CUDA) that
imports the ``preload`` modules in order (the factory modules of the pipeline's stage processes, and
so torch, transformers and the model code) while the caller goes on starting.  :meth:`ForkServer.start`
has the server fork, as soon as it has imported the modules that process needs (the others' may
still be importing), a stage process that runs
:func:`omnitrio.child.main` for the spec, and returns it as a :class:`ForkedProcess`: a process the
caller watches, waits for and kills like a ``trio.Process`` (through a pidfd, so a pid reused after
the process has gone is never signalled).  Forking costs milliseconds where a fresh interpreter
would import everything again, on the same cores as its siblings.

:meth:`~ForkServer.start` returns None when there is no server to fork from: it refused after its
import (it touched CUDA or runs threads of its own, see :mod:`omnitrio.forkserver_main`; logged
once, with why) or it is gone.  The caller then starts a fresh interpreter instead.

:func:`start_early` starts the server before the caller has loaded its config (a config's
validation imports the stage factories too, so the server's import and the caller's then run side
by side); the next :func:`open_fork_server` of the process adopts it when it preloads every module
asked for, in the same environment (variables added since, as imports such as torch's add them,
aside), and stops it otherwise.  An early server nobody adopts is
killed when the interpreter exits.

Leaving the block closes the server's socket: the server exits (its forks, the stage processes,
live on until they are stopped).  A stage process the server forked reports its exit status
through the server; if the server has gone, :attr:`ForkedProcess.returncode` of a process that
exits afterwards is :data:`UNKNOWN_EXIT`.
"""

from __future__ import annotations

import array
import atexit
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

    def __init__(self, sock: trio.socket.SocketType, preload: list[str], recorder: EventRecorder | None) -> None:
        self._sock = sock
        self._preload = preload
        self._recorder = recorder
        self._sending = trio.Lock()
        self.refused: str | None = None
        """Why the server will fork nothing (None while it can)."""
        self._forks: dict[int, tuple[trio.Event, list[ForkedProcess]]] = {}
        self._live: dict[int, ForkedProcess] = {}
        self._next_seq = 0

    async def start(self, spec: Any, needs: Iterable[str] = ()) -> ForkedProcess | None:
        """Fork a stage process serving ``spec`` (a :class:`~omnitrio.child.ChildSpec`), or None (module
        docstring).  The server forks it once it has imported the modules the process ``needs`` (all
        it preloads when none are named), so a process starts while the server imports the others'."""
        if self.refused is not None:
            return None
        self._next_seq += 1
        seq = self._next_seq
        done, forked = self._forks[seq] = (trio.Event(), [])
        try:
            await self._send(("fork", seq, pickle.dumps(spec), list(needs) or self._preload))
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


@attrs.define(eq=False)
class _Launched:
    """A server process started with its preload sent, not yet opened by :func:`open_fork_server`."""

    process: subprocess.Popen[bytes]
    sock: socket.socket
    preload: list[str]
    env: dict[str, str]

    def stop(self) -> None:
        self.sock.close()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


_early: _Launched | None = None


def _launch(preload: list[str], env: dict[str, str]) -> _Launched:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with theirs:
        command = [sys.executable, "-c", ENTRY.format(fd=theirs.fileno())]
        process = subprocess.Popen(command, pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL)
    ours.sendall(pack(("preload", sys.path, preload)))
    return _Launched(process, ours, preload, env)


def start_early(preload: list[str], env: dict[str, str]) -> None:
    """Start this process's fork server now, preloading ``preload`` with ``env``, for a later
    :func:`open_fork_server` to adopt (module docstring).  Replaces an early server not yet adopted."""
    global _early
    if _early is not None:
        _early.stop()
    else:
        atexit.register(_stop_early)
    _early = _launch(preload, env)


def _stop_early() -> None:
    global _early
    if _early is not None:
        _early.stop()
        _early = None


def _adopt_or_launch(preload: list[str], env: dict[str, str]) -> _Launched:
    """The early server when it fits ``preload`` and ``env``, else a new one (an unfit early one stops)."""
    global _early
    early, _early = _early, None
    if early is not None:
        same_env = all(env.get(key) == value for key, value in early.env.items())  # imports may add keys
        if set(preload) <= set(early.preload) and same_env and early.process.poll() is None:
            return early
        log.debug("fork server: the early one does not fit this pipeline; starting another")
        early.stop()
    return _launch(preload, env)


async def _exited(process: subprocess.Popen[bytes]) -> None:
    """Wait until ``process`` has exited (its pidfd readable), then reap it."""
    pidfd = os.pidfd_open(process.pid)
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        trio.lowlevel.notify_closing(pidfd)
        os.close(pidfd)
    process.wait()


@asynccontextmanager
async def open_fork_server(
    preload: list[str], env: dict[str, str], recorder: EventRecorder | None = None
) -> AsyncIterator[ForkServer]:
    """Start a fork server preloading ``preload`` with ``env`` (or adopt the early one,
    :func:`start_early`); stop it on exit (module docstring).

    ``recorder`` gets its start-up events."""
    launched = _adopt_or_launch(preload, env)
    sock = trio.socket.from_stdlib_socket(launched.sock)
    server = ForkServer(sock, launched.preload, recorder)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server._read)
            yield server
            nursery.cancel_scope.cancel()
    finally:
        sock.close()
        with trio.move_on_after(5.0) as waiting:
            waiting.shield = True
            await _exited(launched.process)
        if launched.process.poll() is None:
            launched.stop()
