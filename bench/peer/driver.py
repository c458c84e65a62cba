"""Runs the shared benchmark bodies on SGLang-Omni 0.1.9 (asyncio), inside the peer's venv.

Invoked by ``python -m bench`` as ``bench/.peer-venv/bin/python -m bench.peer.driver``
with the stub and the seed's stage modules on ``PYTHONPATH``; writes its results as JSON
to ``--out`` and its progress to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

from sglang_omni.config.schema import EndpointsConfig, FactoryArgs, PipelineConfig, StageConfig
from sglang_omni.pipeline.mp_runner import MultiProcessPipelineRunner
from sglang_omni.proto import StreamMessage

from bench import workloads
from bench.measure import Progress, child_pids, loadavg


class AsyncioAio:
    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def map_bounded(self, fn: Callable[[Any], Awaitable[None]], items: Iterable[Any], window: int) -> None:
        slots = asyncio.Semaphore(window)
        tasks = set()

        async def run(item: Any) -> None:
            try:
                await fn(item)
            finally:
                slots.release()

        for item in items:
            await slots.acquire()
            tasks.add(asyncio.ensure_future(run(item)))
        await asyncio.gather(*tasks)


class PeerApi:
    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.coordinator = runner.coordinator

    async def submit(self, rid: str, inputs: Any) -> Any:
        return await self.coordinator.submit(rid, inputs)

    @asynccontextmanager
    async def stream(self, rid: str, inputs: Any) -> AsyncIterator[Any]:
        gen = self.coordinator.stream(rid, inputs)
        try:
            yield gen
        finally:
            await gen.aclose()

    def is_chunk(self, msg: Any) -> bool:
        return isinstance(msg, StreamMessage)

    async def abort(self, rid: str) -> bool:
        return await self.coordinator.abort(rid)

    async def stage_pids(self) -> dict[str, int]:
        return {f"child{i}": pid for i, pid in enumerate(child_pids())}


class PeerRuntime:
    name = "peer-sglang-omni"
    process = True
    classes = SimpleNamespace(
        PipelineConfig=PipelineConfig, StageConfig=StageConfig, FactoryArgs=FactoryArgs, EndpointsConfig=EndpointsConfig
    )
    fanin_module = "ch4_fanin_stages"
    batch_module = "ch4_batch_stages"

    def __init__(self) -> None:
        self.aio = AsyncioAio()

    @asynccontextmanager
    async def open(self, config: Any) -> AsyncIterator[tuple[PeerApi, dict[str, float]]]:
        times: dict[str, float] = {}
        runner = MultiProcessPipelineRunner(config)
        t0 = time.perf_counter()
        await runner.start(timeout=120)
        times["start_s"] = time.perf_counter() - t0
        try:
            yield PeerApi(runner), times
        finally:
            t1 = time.perf_counter()
            await runner.stop()
            times["stop_s"] = time.perf_counter() - t1


async def main(quick: bool, out: str, only: set[str] | None, budget_s: float | None) -> None:
    for module in ("bench.toy_stages", "bench.toy_stream"):  # once here, not inside the first timed start
        importlib.import_module(module)

    def save(results: dict[str, Any]) -> None:
        with open(out + ".part", "w") as f:
            json.dump({"runtime": "sglang-omni==0.1.9", "loadavg_end": loadavg(), "results": results}, f, indent=1)
        os.replace(out + ".part", out)

    progress = Progress("peer")
    await workloads.run_suite(PeerRuntime(), quick, progress, only, budget_s, on_result=save)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default="")
    parser.add_argument("--budget-s", type=float, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(main(args.quick, args.out, set(filter(None, args.only.split(","))), args.budget_s))
