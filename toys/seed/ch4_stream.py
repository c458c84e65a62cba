"""Seed experiment 3 driven by omnitrio: a talker streaming codes to a vocoder."""

import sys
import tempfile

import trio

from omnitrio import CompleteMessage, EndpointsConfig, PipelineConfig, StageConfig, StreamMessage, open_pipeline

M = "toys.seed.ch4_stream_stages"


def make_config() -> PipelineConfig:
    return PipelineConfig(
        model_path="toy",
        entry_stage="talker",
        stages=[
            StageConfig(
                name="talker",
                process="p_talker",
                factory_path=f"{M}.create_talker",
                next="vocoder",
                stream_to=["vocoder"],
            ),
            StageConfig(
                name="vocoder",
                process="p_vocoder",
                factory_path=f"{M}.create_vocoder",
                terminal=True,
                can_accept_stream_before_payload=True,
            ),
        ],
        endpoints=EndpointsConfig(base_path=tempfile.mkdtemp(prefix="omni-")),
    )


async def main(inline: bool) -> None:
    async with open_pipeline(make_config(), inline=inline) as pipeline:
        async for msg in pipeline.stream("r1", "say something"):
            if isinstance(msg, StreamMessage):
                print(f"流式块 #{msg.chunk_id} 来自 {msg.from_stage}：{msg.chunk}")
            elif isinstance(msg, CompleteMessage):
                print(f"完成 来自 {msg.from_stage}：{msg.result}")


if __name__ == "__main__":
    trio.run(main, "--inline" in sys.argv)
