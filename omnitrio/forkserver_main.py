"""The fork server's own process: import the heavy modules once, then fork stage processes from it.

Started by :mod:`omnitrio.forkserver` as ``python -c`` :data:`ENTRY` with one end of a Unix socket
pair as file descriptor ``fd``.  The first message it reads, ``("preload", path, modules)``,
names ``sys.path`` and the modules to preload; it imports them in that order, then answers
``("ready", failed, up_ns, preloaded_ns)`` — ``failed`` maps each module that could not be imported to why
(the stage process that needs it reports the real error), the times (``time.monotonic_ns()``)
say when the server ran its first line and when its preload was done — or
``("refused", why)`` when, after importing, it is no longer safe to fork: the process touched
CUDA (a CUDA driver library is mapped) or runs a thread besides its own (an OpenMP pool, say).
A refusing server exits; the caller then starts fresh interpreters instead.

For each ``("fork", seq, blob, needs)`` it forks, as soon as it has imported the modules ``needs``
names (so a stage process whose modules are in starts while the server imports the others'
modules; a request may come at any time, also while it preloads), a child that unpickles ``blob`` (a
:class:`~omnitrio.child.ChildSpec`) and runs :func:`omnitrio.child.main`, and answers
``("forked", seq, pid)`` with a pidfd of the child attached (so the caller holds the process,
whatever happens to the pid afterwards).  It reaps each child and reports ``("exited", pid,
code)``, ``code`` as :attr:`subprocess.Popen.returncode` has it.  It ends when the caller closes
its end of the socket (or dies).

Only the standard library is imported here before the preload, so that the preload is all the
server spends its start on; the module's framing (:func:`pack`, :func:`unpack_length`) is shared
with the caller's side.
"""

from __future__ import annotations

import importlib
import os
import pickle
import selectors
import signal
import socket
import struct
import sys
import time
import traceback
from typing import Any, NoReturn

ENTRY = "from omnitrio.forkserver_main import serve; serve({fd})"
"""The ``python -c`` program of the server, formatted with the socket's file descriptor."""

HEADER = struct.Struct("!I")
CUDA_DRIVER = "libcuda.so"
"""Mapped once a process has initialised CUDA (the runtime library alone initialises nothing)."""


def pack(message: tuple[Any, ...]) -> bytes:
    """``message`` as one frame: its pickled length, then the pickle."""
    body = pickle.dumps(message)
    return HEADER.pack(len(body)) + body


def unpack_length(header: bytes) -> int:
    return int(HEADER.unpack(header)[0])


def unsafe_to_fork() -> str | None:
    """Why this process must not fork now, or None: it touched CUDA, or runs other threads."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            if CUDA_DRIVER in line:
                return f"it touched CUDA ({line.split()[-1]} is mapped)"
    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:
        return f"it runs {threads - 1} thread(s) besides its own (an OpenMP pool? OMP_NUM_THREADS)"
    return None


def serve(fd: int) -> NoReturn:
    """The server's life (module docstring); it ends quietly when the caller has gone."""
    up_ns = time.monotonic_ns()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller decides when its processes stop
    conn = socket.socket(fileno=fd)
    try:
        _serve(conn, up_ns)
    except (EOFError, OSError):
        pass
    os._exit(0)  # the interpreter's teardown would only free what the preload imported


def _serve(conn: socket.socket, up_ns: int) -> None:
    _, path, modules = _receive(conn)
    sys.path[:0] = [p for p in path if p not in sys.path]
    failed: dict[str, str] = {}
    imported: set[str] = set()
    pending: list[tuple[int, bytes, list[str]]] = []  # fork requests waiting for their modules
    with selectors.DefaultSelector() as selector:
        selector.register(conn, selectors.EVENT_READ)
        children: dict[int, int] = {}  # pidfd → pid
        for module in modules:
            try:
                importlib.import_module(module)
            except BaseException as exc:  # the stage process that needs it reports it
                failed[module] = f"{type(exc).__name__}: {exc}"
            imported.add(module)
            why = unsafe_to_fork()
            if why is not None:
                conn.sendall(pack(("refused", f"after importing {module!r}, {why}")))
                return
            _answer(conn, selector, children, pending, timeout=0)  # what came while importing
            due = [request for request in pending if set(request[2]) <= imported]
            pending[:] = [request for request in pending if request not in due]
            for seq, blob, _ in due:
                _fork_for(conn, selector, children, seq, blob)
        conn.sendall(pack(("ready", failed, up_ns, time.monotonic_ns())))
        for seq, blob, _ in pending:
            _fork_for(conn, selector, children, seq, blob)
        while True:
            _answer(conn, selector, children, None, timeout=None)


def _answer(
    conn: socket.socket,
    selector: selectors.BaseSelector,
    children: dict[int, int],
    pending: list[tuple[int, bytes, list[str]]] | None,
    timeout: float | None,
) -> None:
    """Take each fork request (into ``pending`` while preloading, else forking at once) and report each
    child's exit that is there (``timeout=0``: without waiting)."""
    while ready := selector.select(timeout):
        for key, _ in ready:
            if key.fileobj is conn:
                _, seq, blob, needs = _receive(conn)
                if pending is None:
                    _fork_for(conn, selector, children, seq, blob)
                else:
                    pending.append((seq, blob, needs))
            else:
                pidfd = int(key.fd)
                selector.unregister(pidfd)
                pid = children.pop(pidfd)
                _, status = os.waitpid(pid, 0)
                os.close(pidfd)
                conn.sendall(pack(("exited", pid, os.waitstatus_to_exitcode(status))))
        if timeout is None:
            return


def _fork_for(
    conn: socket.socket, selector: selectors.BaseSelector, children: dict[int, int], seq: int, blob: bytes
) -> None:
    pidfd = _fork(conn, selector, children, blob)
    socket.send_fds(conn, [pack(("forked", seq, children[pidfd]))], [pidfd])
    selector.register(pidfd, selectors.EVENT_READ)


def _fork(conn: socket.socket, selector: selectors.BaseSelector, children: dict[int, int], blob: bytes) -> int:
    """Fork a stage process for the pickled spec ``blob``; its pidfd (the child never returns)."""
    pid = os.fork()
    if pid == 0:
        forked_ns = time.monotonic_ns()
        code = 1
        try:
            selector.close()
            conn.close()
            for pidfd in children:
                os.close(pidfd)
            _reseed()
            from omnitrio.child import leave, main

            leave(main(pickle.loads(blob), (forked_ns, forked_ns)))
        except BaseException:  # nothing may return into the server's loop
            traceback.print_exc()
        finally:
            os._exit(code)
    pidfd = os.pidfd_open(pid)
    children[pidfd] = pid
    return pidfd


def _reseed() -> None:
    """Give the child random state of its own, as a fresh interpreter would have (``random`` reseeds itself)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _receive(conn: socket.socket) -> Any:
    header = _exactly(conn, HEADER.size)
    return pickle.loads(_exactly(conn, unpack_length(header)))


def _exactly(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError("the caller closed the fork server's socket")
        data += chunk
    return bytes(data)
