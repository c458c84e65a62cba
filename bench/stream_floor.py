"""The streaming floor: the seed's talker → vocoder with the least runtime around them.

Three processes, as in ``bench`` streaming with one process per stage: a caller, the
seed's ``ToyTalkerScheduler`` and ``ToyVocoderScheduler`` (unchanged, each in a thread
with its ``queue.Queue`` inbox and outbox, the contract's shape).  Around them there is
only what any runtime must do to carry a chunk, built from omnitrio's own parts: a trio
loop per process, woken by the scheduler's outbox (the bridge's ``WakingCondition``);
everything drained in one pass pickled as one frame and sent on omnitrio's Unix link
(``UnixLink``/``UnixInbound``); each frame read, unpickled and put in the next inbox in
one step.

Left out, so that the figures are a bound no runtime with this contract can beat here:
flow control, fairness between requests, per-request tasks and cancel scopes, aborts,
failure handling, tracing and metrics.  A tiny tensor crosses as its values, the
cheapest form measured (see ``omnitrio.transport.tensors``).

Run: ``python -m bench.stream_floor [seconds per point]``; writes
``bench/results/stream_floor.json``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from bench.measure import latency_ms, loadavg
from omnitrio.bridge import WakingCondition
from omnitrio.transport.tensors import listed_tensor
from omnitrio.transport.unix import UnixInbound, UnixLink

STEPS = 100
RESULTS = Path(__file__).parent / "results"


async def serve(path: str, on_items: Callable[[list[Any]], None], *, task_status: Any) -> None:
    """Listen on ``path``; each frame that arrives is one pickled list of items."""

    async def dispatch(sender: str, frames: list[bytes]) -> None:
        for frame in frames:
            on_items(pickle.loads(frame))

    await UnixInbound(path).serve(dispatch, task_status=task_status)


def send(link: UnixLink, items: list[Any]) -> None:
    """Queue ``items`` as one frame; what is queued in one pass of the loop leaves as one write."""
    link.send(pickle.dumps(items, protocol=5))


def wake_on_put(outbox: queue.Queue[Any], drain: Callable[[], None]) -> None:
    """Call ``drain`` in trio once per burst of ``outbox.put`` (as omnitrio's bridge does)."""
    token = trio.lowlevel.current_trio_token()
    pending = threading.Lock()

    def run_drain() -> None:
        pending.release()
        drain()

    def request_drain() -> None:
        if pending.acquire(blocking=False):
            token.run_sync_soon(run_drain)

    outbox.not_empty = WakingCondition(outbox.mutex, request_drain)


def put_all(inbox: queue.Queue[Any], messages: list[Any]) -> None:
    with inbox.mutex:
        inbox.queue.extend(messages)
        inbox.unfinished_tasks += len(messages)
        inbox.not_empty.notify(len(messages))


def take_all(outbox: queue.Queue[Any]) -> list[Any]:
    with outbox.mutex:
        items = list(outbox.queue)
        outbox.queue.clear()
    return items


async def run_stage(role: str, listen: str, downstream: str) -> None:
    """One stage process: read frames into the scheduler, write its outputs downstream."""
    import torch

    from bench.toy_stream import create_talker, create_vocoder
    from omnitrio.contract import IncomingMessage, OmniRequest, StagePayload, StreamItem

    scheduler = create_talker(STEPS) if role == "talker" else create_vocoder()
    link = UnixLink(downstream, role.encode())
    chunk_ids: dict[str, int] = {}

    def incoming(item: tuple[Any, ...]) -> Any:
        kind, rid = item[0], item[1]
        if kind == "chunk":
            _, _, chunk_id, values, dtype, metadata = item
            data = listed_tensor(values, dtype, False)
            return IncomingMessage(rid, "stream_chunk", StreamItem(chunk_id, data, "talker", metadata))
        if kind == "done":
            return IncomingMessage(rid, "stream_done", "talker")
        return IncomingMessage(rid, "new_request", StagePayload(rid, OmniRequest(), item[2]))

    def outgoing(message: Any) -> list[tuple[Any, ...]]:
        rid = message.request_id
        if message.type == "stream":
            chunk_id = chunk_ids.get(rid, 0)
            chunk_ids[rid] = chunk_id + 1
            data = message.data
            if isinstance(data, torch.Tensor):
                dtype = str(data.dtype).removeprefix("torch.")
                return [("chunk", rid, chunk_id, data.tolist(), dtype, message.metadata)]
            return [("chunk", rid, chunk_id, data, "", message.metadata)]
        chunk_ids.pop(rid, None)
        return [("done", rid), ("payload", rid, message.data.data)]

    def drain() -> None:
        send(link, [item for message in take_all(scheduler.outbox) for item in outgoing(message)])

    wake_on_put(scheduler.outbox, drain)
    threading.Thread(target=scheduler.start, daemon=True).start()
    async with trio.open_nursery() as nursery:  # until the parent terminates this process
        nursery.start_soon(link.pump)
        await nursery.start(serve, listen, lambda items: put_all(scheduler.inbox, [incoming(i) for i in items]))


def stage_main(role: str, listen: str, downstream: str) -> None:
    sys.setswitchinterval(0.001)  # as in omnitrio's stage processes
    trio.run(run_stage, role, listen, downstream)


class Caller:
    """The caller process's side: submits to the talker, counts what the vocoder sends back."""

    def __init__(self, link: UnixLink) -> None:
        self.link = link
        self.live: dict[str, tuple[float, list[float], trio.Event]] = {}
        self.chunks = 0

    def on_items(self, items: list[Any]) -> None:
        for item in items:
            start, first, finished = self.live[item[1]]
            if item[0] == "chunk":
                self.chunks += 1
                if not first:
                    first.append(time.perf_counter() - start)
            elif item[0] == "payload":
                finished.set()

    async def measure(self, concurrency: int, seconds: float) -> dict[str, Any]:
        """``concurrency`` requests at a time for ``seconds``: chunks/s and first-chunk latency."""
        firsts: list[float] = []
        deadline = time.perf_counter() + seconds
        sent = 0

        async def worker() -> None:
            nonlocal sent
            while time.perf_counter() < deadline:
                rid = f"c{concurrency}-{sent}"
                sent += 1
                first: list[float] = []
                finished = trio.Event()
                self.live[rid] = (time.perf_counter(), first, finished)
                send(self.link, [("new", rid, None)])
                await finished.wait()
                del self.live[rid]
                firsts.extend(first)

        self.chunks = 0
        began = time.perf_counter()
        async with trio.open_nursery() as workers:
            for _ in range(concurrency):
                workers.start_soon(worker)
        wall = time.perf_counter() - began
        return {"chunks_per_s": self.chunks / wall, "requests": sent, "first_chunk": latency_ms(firsts)}


async def drive(talker: str, listen: str, seconds: float) -> dict[str, Any]:
    """Warm up for a second, then measure c=1 and c=16 for ``seconds`` each."""
    caller = Caller(UnixLink(talker, b"caller"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller.link.pump)
        await nursery.start(serve, listen, caller.on_items)
        await caller.measure(1, 1.0)
        figures = {"c1": await caller.measure(1, seconds), "c16": await caller.measure(16, seconds)}
        nursery.cancel_scope.cancel()
    return figures


def run(seconds: float = 5.0) -> dict[str, Any]:
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="omnitrio-floor-") as tmp:
        paths = {name: os.path.join(tmp, name) for name in ("talker", "vocoder", "caller")}
        stages = [
            spawn.Process(target=stage_main, args=("talker", paths["talker"], paths["vocoder"]), daemon=True),
            spawn.Process(target=stage_main, args=("vocoder", paths["vocoder"], paths["caller"]), daemon=True),
        ]
        for process in stages:
            process.start()
        try:
            figures = trio.run(drive, paths["talker"], paths["caller"], seconds)
        finally:
            for process in stages:
                process.terminate()
                process.join(10)
    return {"steps": STEPS, "seconds": seconds, **figures, "loadavg": loadavg()}


def main() -> None:
    figures = run(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0)
    for concurrency in (1, 16):
        point = figures[f"c{concurrency}"]
        first = point["first_chunk"]
        print(
            f"floor c={concurrency}: {point['chunks_per_s']:,.0f} chunks/s, "
            f"first chunk p50 {first['p50_ms']:.2f} ms p99 {first['p99_ms']:.2f} ms ({point['requests']} requests)"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "stream_floor.json").write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
