"""OpenAI-compatible chat servers for the remote responder's tests, on loopback.

* :func:`scripted_server`: an ASGI app on hypercorn in the test's trio run that answers each
  ``POST /v1/chat/completions`` with the next scripted :class:`Reply` (SSE chunks, an error status, or
  chunks and then a hold until the client goes; the last reply answers every request after it), and
  records what it was sent and when a client left.
* :func:`llama_server`: a real ``python -m llama_cpp.server`` process (llama-cpp-python's server
  extra) serving a GGUF file on port 0; stopped and reaped on exit.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import attrs
import hypercorn.trio
import trio
from hypercorn.config import Config


@attrs.frozen
class Reply:
    """One scripted answer: ``chunks`` as SSE events, then ``[DONE]`` (or, with ``hold``, nothing
    more until the client closes the connection); a ``status`` other than 200 sends ``error`` as JSON."""

    chunks: list[dict[str, Any]] = attrs.field(factory=list)
    hold: bool = False
    status: int = 200
    error: dict[str, Any] | None = None


def text_chunks(*deltas: str, finish_reason: str = "stop", usage: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """A streamed answer made of ``deltas``, as OpenAI sends it."""
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    chunks += [{"choices": [{"index": 0, "delta": {"content": delta}, "finish_reason": None}]} for delta in deltas]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason}]})
    if usage is not None:
        chunks.append({"choices": [], "usage": usage})
    return chunks


@attrs.define(eq=False)
class ScriptedServer:
    replies: list[Reply]
    port: int = 0
    bodies: list[dict[str, Any]] = attrs.field(factory=list)
    headers: list[dict[str, str]] = attrs.field(factory=list)
    left: list[trio.Event] = attrs.field(factory=list)  # one per held reply: set when its client has gone
    asked: trio.Event = attrs.field(factory=trio.Event)  # a request arrived

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(json.loads(body))
        self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        self.asked.set()
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]  # the last one, again and again
        if reply.status != 200:
            error = json.dumps({"error": reply.error or {"message": "no"}}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": reply.status,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": error})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for chunk in reply.chunks:
            event = f"data: {json.dumps(chunk)}\n\n".encode()
            await send({"type": "http.response.body", "body": event, "more_body": True})
        if reply.hold:
            left = trio.Event()
            self.left.append(left)
            while (await receive())["type"] != "http.disconnect":
                pass
            left.set()
            return
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


@asynccontextmanager
async def scripted_server(*replies: Reply) -> AsyncIterator[ScriptedServer]:
    """A :class:`ScriptedServer` listening on a loopback port while the block runs."""
    server = ScriptedServer(list(replies))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    server.port = sock.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]
    config.graceful_timeout = 0.1
    async with trio.open_nursery() as nursery:
        await nursery.start(hypercorn.trio.serve, server, config)
        yield server
        nursery.cancel_scope.cancel()


_LISTENING = re.compile(rb"Uvicorn running on http://127\.0\.0\.1:(\d+)")


@contextmanager
def llama_server(model: Path, *, chat_format: str | None = None, start_timeout: float = 120.0) -> Iterator[str]:
    """``python -m llama_cpp.server`` on ``model`` at a free loopback port; yields its base URL (``.../v1``)."""
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1", "--port", "0"]
    command += ["--n_threads", "1", "--n_ctx", "2048", "--seed", "7", "--verbose", "False"]
    if chat_format is not None:
        command += ["--chat_format", chat_format]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    watchdog = threading.Timer(start_timeout, proc.kill)  # a server that never says where it listens
    watchdog.start()
    log: list[bytes] = []
    try:
        port = None
        for line in proc.stdout:
            log.append(line)
            if (found := _LISTENING.search(line)) is not None:
                port = int(found[1])
                break
        watchdog.cancel()
        if port is None:
            raise RuntimeError(f"llama_cpp.server did not start: {b''.join(log[-20:]).decode(errors='replace')}")
        drain = threading.Thread(target=lambda: [log.append(line) for line in proc.stdout or ()], daemon=True)
        drain.start()  # its log goes on; a full pipe would stall it
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        watchdog.cancel()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
