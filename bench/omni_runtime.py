"""omnitrio as a benchmark :class:`bench.workloads.Runtime`: trio primitives and ``open_pipeline``."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import trio

import omnitrio
from omnitrio import StreamMessage, open_pipeline


class TrioAio:
    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)

    async def map_bounded(self, fn: Callable[[Any], Awaitable[None]], items: Iterable[Any], window: int) -> None:
        slots = trio.Semaphore(window)

        async def run(item: Any) -> None:
            try:
                await fn(item)
            finally:
                slots.release()

        async with trio.open_nursery() as nursery:
            for item in items:
                await slots.acquire()
                nursery.start_soon(run, item)


class OmniApi:
    def __init__(self, pipeline: omnitrio.Pipeline) -> None:
        self.pipeline = pipeline

    async def submit(self, rid: str, inputs: Any) -> Any:
        return await self.pipeline.submit(rid, inputs)

    def stream(self, rid: str, inputs: Any) -> Any:
        return self.pipeline.stream(rid, inputs)

    def is_chunk(self, msg: Any) -> bool:
        return isinstance(msg, StreamMessage)

    async def abort(self, rid: str) -> bool:
        return await self.pipeline.abort(rid, wait=True)

    async def stage_pids(self) -> dict[str, int]:
        health = await self.pipeline.health()
        return {name: int(s["pid"]) for name, s in health["stages"].items()}


class OmniRuntime:
    """omnitrio inline (every stage in this trio run) or with one OS process per stage."""

    classes = omnitrio
    fanin_module = "toys.seed.ch4_fanin_stages"
    batch_module = "toys.seed.ch4_batch_stages"

    def __init__(self, process: bool) -> None:
        self.process = process
        self.name = "omnitrio-processes" if process else "omnitrio-inline"
        self.aio = TrioAio()

    @asynccontextmanager
    async def open(self, config: Any) -> AsyncIterator[tuple[OmniApi, dict[str, float]]]:
        times: dict[str, float] = {}
        t0 = time.perf_counter()
        manager = open_pipeline(config, inline=not self.process)
        pipeline = await manager.__aenter__()
        times["start_s"] = time.perf_counter() - t0
        try:
            yield OmniApi(pipeline), times
        except BaseException as exc:
            t1 = time.perf_counter()
            if not await manager.__aexit__(type(exc), exc, exc.__traceback__):
                raise
            times["stop_s"] = time.perf_counter() - t1
        else:
            t1 = time.perf_counter()
            await manager.__aexit__(None, None, None)
            times["stop_s"] = time.perf_counter() - t1
