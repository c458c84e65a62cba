"""Seed experiment 2 driven by omnitrio: the batching window, idle and not."""

import sys
import tempfile
import time

import trio

from omnitrio import EndpointsConfig, FactoryArgs, PipelineConfig, StageConfig, open_pipeline


def make_config(wait_when_idle: bool) -> PipelineConfig:
    return PipelineConfig(
        model_path="toy",
        entry_stage="encoder",
        stages=[
            StageConfig(
                name="encoder",
                process="p_enc",
                terminal=True,
                factory_path="toys.seed.ch4_batch_stages.create_encoder",
                factory=FactoryArgs(max_batch_wait_ms=200, batch_wait_when_idle=wait_when_idle),
            )
        ],
        endpoints=EndpointsConfig(base_path=tempfile.mkdtemp(prefix="omni-")),
    )


async def run(wait_when_idle: bool, inline: bool) -> None:
    async with open_pipeline(make_config(wait_when_idle), inline=inline) as pipeline:
        results: list = [None] * 4

        async def one(i: int) -> None:
            results[i] = await pipeline.submit(f"burst-{i}", i)

        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(one, i)
        print(f"batch_wait_when_idle={wait_when_idle}")
        print("  同时到达的 4 个请求，各自所在批的大小：", [r["batch_size"] for r in results])
        t0 = time.perf_counter()
        lone = await pipeline.submit("lone", 0)
        waited = (time.perf_counter() - t0) * 1000
        print(f"  单独一个请求：批大小 {lone['batch_size']}，多等了 200 ms 吗：{waited >= 180}")


async def main(inline: bool) -> None:
    await run(True, inline)
    await run(False, inline)


if __name__ == "__main__":
    trio.run(main, "--inline" in sys.argv)
