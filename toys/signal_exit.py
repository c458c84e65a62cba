"""Serve a config, put requests in flight, signal the server, and watch every stage process leave.

:func:`serve_and_signal` starts ``python -m omnitrio serve`` in a subprocess (:mod:`toys.served`),
waits until it serves, reads every stage process's pid from
``/health``, starts the requests it is asked for — streamed chat answers with audio, transcriptions,
speech, realtime sessions streaming audio — and once each has begun (a first chunk, a session
created and audio sent) sends the signal.  It reports, per stage process, the seconds from the
signal until the process was gone (its pidfd), the server's exit status, the server's lines saying
it killed a process, and what the pipeline left in /dev/shm and in ``TMPDIR``.
``tests/test_signal_exits.py`` runs it for every shipped config; ``bench/exits.py`` runs it many
times and reports the slowest exits.
"""

from __future__ import annotations

import base64
import io
import os
import signal
import time
import wave
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import trio

from omnitrio.client import OmnitrioClient, open_realtime
from toys.served import open_server

KINDS = ("chat", "transcription", "speech", "realtime")


@attrs.frozen
class Exits:
    """What one signalled server did (see the module docstring)."""

    signal: str
    healthy_s: float
    """From the server's start until it answered ``/health``."""
    processes: dict[str, float | None]
    """Stage process name → seconds from the signal until it was gone (None: still there at the end)."""
    server_code: int | None
    killed: list[str]
    leftovers: list[str]
    stderr: str


def per_stage(stages: list[str]) -> list[str]:
    """``--set`` arguments that give each of ``stages`` a process of its own name."""
    return [arg for name in stages for arg in ("--set", f'{name}.process="{name}"')]


def tone_wav(seconds: float = 2.0, rate: int = 16_000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.3 * np.sin(2 * np.pi * 330 * t) * 32767).astype(np.int16)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return out.getvalue()


async def serve_and_signal(
    serve_args: list[str],
    signum: signal.Signals,
    tmpdir: Path,
    *,
    kinds: tuple[str, ...] = KINDS,
    each: int = 2,
    startup_timeout: float = 600,
) -> Exits:
    """Serve, start ``each`` requests of every kind in ``kinds``, signal, watch (module docstring)."""
    async with open_server(serve_args, tmpdir, startup_timeout=startup_timeout) as served:
        server = served.process
        async with OmnitrioClient(served.url) as client:
            health = await client.health()
            healthy_s = time.perf_counter() - served.began
            pids = {entry["process"]: entry["pid"] for entry in health["stages"].values()}
            pids = {name: pid for name, pid in pids.items() if pid != server.pid}
            started = trio.Semaphore(0)
            async with trio.open_nursery() as busy:
                for kind in kinds:
                    for _ in range(each):
                        busy.start_soon(_request, client, served.url, kind, started)
                for _ in range(len(kinds) * each):
                    await started.acquire()
                gone: dict[str, float | None] = dict.fromkeys(pids)
                async with trio.open_nursery() as watching:
                    for name, pid in pids.items():
                        await watching.start(_watch, name, pid, gone)
                    signalled = time.perf_counter()
                    server.send_signal(signum)
                    with trio.move_on_after(120):
                        await server.wait()
                    with trio.move_on_after(10):
                        while None in gone.values():
                            await trio.sleep(0.05)
                    watching.cancel_scope.cancel()
                busy.cancel_scope.cancel()
    processes = {name: None if at is None else at - signalled for name, at in gone.items()}
    shm = [f"/dev/shm/{n}" for n in os.listdir("/dev/shm") if n.startswith(f"omnitrio-{server.pid}-")]
    return Exits(
        signal=signum.name,
        healthy_s=healthy_s,
        processes=processes,
        server_code=server.returncode,
        killed=[line for line in served.lines if "killed it" in line],
        leftovers=shm + [str(path) for path in tmpdir.glob("omnitrio-*")],
        stderr=served.stderr,
    )


async def _watch(name: str, pid: int, gone: dict[str, float | None], *, task_status: Any) -> None:
    fd = os.pidfd_open(pid)
    try:
        task_status.started()
        await trio.lowlevel.wait_readable(fd)
        gone[name] = time.perf_counter()
    finally:
        os.close(fd)


async def _request(client: OmnitrioClient, url: str, kind: str, started: trio.Semaphore) -> None:
    """One request of ``kind``; ``started`` is released once, when it is under way (or failed to
    start).  Returns only by cancellation."""
    under_way = trio.Event()

    async def release_once() -> None:
        await under_way.wait()
        started.release()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(release_once)
        try:
            match kind:
                case "chat":
                    messages = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
                    fields = {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}}
                    async for _ in client.chat_stream(messages, max_tokens=256, **fields):
                        under_way.set()
                case "transcription":
                    under_way.set()
                    await client.transcribe(tone_wav(4.0))
                case "speech":
                    text = "A sentence long enough to keep the voice busy for a while, and then some more of it."
                    async for _ in client.speech_events(text):
                        under_way.set()
                case "realtime":
                    await _realtime(url, under_way)
        except Exception:
            pass  # the server going away ends a request; only its start matters here
        under_way.set()
        await trio.sleep_forever()


async def _realtime(url: str, under_way: trio.Event) -> None:
    ws = url.replace("http://", "ws://") + "/v1/realtime"
    chunk = base64.b64encode(np.zeros(2_400, np.int16).tobytes()).decode()  # 0.1 s at 24 kHz
    async with open_realtime(ws) as rt:
        await rt.receive()  # session.created
        await rt.send({"type": "input_audio_buffer.append", "audio": chunk})
        under_way.set()
        while True:
            await rt.send({"type": "input_audio_buffer.append", "audio": chunk})
            await trio.sleep(0.1)
