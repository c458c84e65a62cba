"""Seed experiment 1 driven by omnitrio: fan-out with projections, fan-in with merge."""

import sys
import tempfile

import trio

from omnitrio import EndpointsConfig, PipelineConfig, StageConfig, open_pipeline

M = "toys.seed.ch4_fanin_stages"


def make_config() -> PipelineConfig:
    return PipelineConfig(
        model_path="toy",
        entry_stage="split",
        stages=[
            StageConfig(
                name="split",
                process="p_split",
                factory_path=f"{M}.create_split",
                next=["upper", "count"],
                project_payload={"upper": f"{M}.project_to_upper", "count": f"{M}.project_to_count"},
            ),
            StageConfig(name="upper", process="p_upper", factory_path=f"{M}.create_upper", next="join"),
            StageConfig(name="count", process="p_count", factory_path=f"{M}.create_count", next="join"),
            StageConfig(
                name="join",
                process="p_join",
                factory_path=f"{M}.create_join",
                wait_for=["upper", "count"],
                merge_fn=f"{M}.merge",
                terminal=True,
            ),
        ],
        endpoints=EndpointsConfig(base_path=tempfile.mkdtemp(prefix="omni-")),
    )


async def main(inline: bool) -> None:
    async with open_pipeline(make_config(), inline=inline) as pipeline:
        texts = ["hello omni world", "stage by stage"]
        results: list = [None] * len(texts)

        async def one(i: int, text: str) -> None:
            results[i] = await pipeline.submit(f"r{i}", text)

        async with trio.open_nursery() as nursery:
            for i, t in enumerate(texts):
                nursery.start_soon(one, i, t)
        for r in results:
            print(r)


if __name__ == "__main__":
    trio.run(main, "--inline" in sys.argv)
