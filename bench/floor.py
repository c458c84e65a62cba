"""The raw transport floor measured in the same run: what no runtime on this machine can beat.

* zmq ipc round trip between two processes: plain blocking pyzmq, PUSH→PULL each way
  (the shape of a runtime hop), 100-byte messages;
* trio ⇄ thread round trip: trio puts on a ``SimpleQueue``, the thread answers with
  ``run_sync_soon`` into a memory channel (the best pattern in limits.md);
* memcpy GB/s: 128 MB copied into a pre-faulted buffer (numpy, one thread);
* one request task: the cheapest form of "one task in one cancel scope per live request
  per stage" (spawned, given one message through a :class:`~omnitrio.mailbox.Mailbox`,
  gone), 256 in flight, in µs of this process's time per request.  A request through the
  seed's fan pipeline lives as such a task at 4 stages and the coordinator, so two cores
  can carry at most ``2e6 / (5 * µs)`` requests a second before any other work;
* the streaming floor (:mod:`bench.stream_floor`): the seed's talker → vocoder in three
  processes with the least runtime any implementation of the scheduler contract needs.
"""

from __future__ import annotations

import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import trio
import zmq

from bench import stream_floor
from bench.measure import MIB, latency_ms, loadavg
from omnitrio.mailbox import Mailbox

_ECHO = """
import sys, zmq
ctx = zmq.Context()
pull = ctx.socket(zmq.PULL); pull.bind(sys.argv[1])
push = ctx.socket(zmq.PUSH); push.connect(sys.argv[2])
while True:
    msg = pull.recv()
    if msg == b"stop":
        break
    push.send(msg)
push.close(linger=1000); pull.close(linger=0); ctx.term()
"""


def zmq_rtt(n: int, warmup: int) -> dict[str, float]:
    """Round trip through an echo process over two ipc PUSH/PULL links."""
    with tempfile.TemporaryDirectory(prefix="omni-floor-") as tmp:
        to_echo, back = f"ipc://{Path(tmp) / 'a'}", f"ipc://{Path(tmp) / 'b'}"
        ctx = zmq.Context()
        pull = ctx.socket(zmq.PULL)
        pull.bind(back)
        child = subprocess.Popen([sys.executable, "-c", _ECHO, to_echo, back])
        push = ctx.socket(zmq.PUSH)
        push.connect(to_echo)
        try:
            msg = b"x" * 100
            samples = []
            for i in range(warmup + n):
                t0 = time.perf_counter()
                push.send(msg)
                pull.recv()
                if i >= warmup:
                    samples.append(time.perf_counter() - t0)
            push.send(b"stop")
            child.wait(timeout=10)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            push.close(linger=0)
            pull.close(linger=0)
            ctx.term()
    return latency_ms(samples)


async def _trio_thread_rtt(n: int, warmup: int) -> dict[str, float]:
    inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    send, receive = trio.open_memory_channel[int](100)
    token = trio.lowlevel.current_trio_token()

    def worker() -> None:
        while (item := inbox.get()) is not None:
            token.run_sync_soon(send.send_nowait, item)

    thread = threading.Thread(target=worker, name="floor-worker", daemon=True)
    thread.start()
    samples = []
    try:
        for i in range(warmup + n):
            t0 = time.perf_counter()
            inbox.put(i)
            await receive.receive()
            if i >= warmup:
                samples.append(time.perf_counter() - t0)
    finally:
        inbox.put(None)
        thread.join()
    return latency_ms(samples)


def trio_thread_rtt(n: int, warmup: int) -> dict[str, float]:
    return trio.run(_trio_thread_rtt, n, warmup)


async def _request_tasks(n: int, in_flight: int) -> float:
    finished = 0
    all_done = trio.Event()

    async def request(box: Mailbox[int], last: int) -> None:
        nonlocal finished
        with trio.CancelScope():
            await box.receive()
        finished += 1
        if finished == last:
            all_done.set()

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for start in range(0, n, in_flight):
            boxes: list[Mailbox[int]] = [Mailbox() for _ in range(in_flight)]
            for box in boxes:
                nursery.start_soon(request, box, start + in_flight)
            for i, box in enumerate(boxes):
                box.put(i)
            await all_done.wait()
            all_done = trio.Event()
    return (time.perf_counter() - t0) / n * 1e6


def request_task(n: int, in_flight: int = 256) -> dict[str, float]:
    us = statistics.median(trio.run(_request_tasks, n, in_flight) for _ in range(3))
    return {"us_per_request": us, "fan_ceiling_req_per_s": 2e6 / (5 * us)}


def memcpy(mb: int = 128, repeats: int = 5) -> dict[str, float]:
    """GB/s of ``np.copyto`` of ``mb`` MB into a buffer written once beforehand (no page faults)."""
    src = np.ones(mb * MIB // 4, dtype=np.float32)
    dst = np.empty_like(src)
    dst.fill(0)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    best = sorted(times)[len(times) // 2]
    return {"GB_per_s": mb * MIB / 1e9 / best, "median_ms": best * 1000, "MB": mb}


def run(quick: bool) -> dict[str, Any]:
    n = 1000 if quick else 5000
    return {
        "zmq_ipc_rtt": zmq_rtt(n, 200),
        "trio_thread_rtt": trio_thread_rtt(n, 200),
        "memcpy_128MB": memcpy(128, 5 if quick else 11),
        "request_task": request_task(n * 4),
        "stream": stream_floor.run(2.0 if quick else 5.0),
        "loadavg": loadavg(),
    }
