"""``python -m omnitrio serve`` in a subprocess, for tests and benches that meet the server as a user does.

``async with open_server(serve_args, tmpdir) as served`` starts the server on a free port (its
``TMPDIR`` the given directory, so what the pipeline leaves there can be found), reads its stderr
into :attr:`Served.lines` and yields once it says it serves (``served.url``).  Leaving the block
stops a server still running with SIGTERM (SIGKILL if it is still there 60 s later).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

SERVING = re.compile(r"omnitrio: serving .* on (http://\S+) ")


@attrs.define
class Served:
    """A running server: its process, URL, the stderr lines so far, and when it was started."""

    process: trio.Process
    url: str = ""
    lines: list[str] = attrs.field(factory=list)
    began: float = attrs.field(factory=time.perf_counter)

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)


@asynccontextmanager
async def open_server(serve_args: list[str], tmpdir: Path, *, startup_timeout: float = 600) -> AsyncIterator[Served]:
    """Serve (module docstring); raises RuntimeError with the server's stderr if it exits before serving."""
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    command = [sys.executable, "-m", "omnitrio", "serve", "--port", "0", "--graceful-timeout", "0", *serve_args]
    began = time.perf_counter()
    process = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE, env=env)
    served = Served(process, began=began)
    serving = trio.Event()

    async def read_stderr() -> None:
        async for line in _lines(process.stderr):
            served.lines.append(line)
            if (found := SERVING.search(line)) and not served.url:
                served.url = found.group(1)
                serving.set()
        serving.set()  # it exited

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_stderr)
            with trio.fail_after(startup_timeout):
                await serving.wait()
            if not served.url:
                raise RuntimeError("the server exited before serving:\n" + served.stderr)
            yield served
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
            with trio.move_on_after(60):
                await process.wait()
            nursery.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def _lines(stream: Any) -> AsyncIterator[str]:
    buffer = b""
    async for chunk in stream:
        buffer += chunk
        *whole, buffer = buffer.split(b"\n")
        for line in whole:
            yield line.decode(errors="replace")
