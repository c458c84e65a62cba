"""The failure model: acknowledged abort, deadlines, isolation, scheduler restarts."""

from __future__ import annotations

import time

import pytest
import trio

from omnitrio import (
    FactoryArgs,
    PipelineConfig,
    RequestAborted,
    RequestFailed,
    RequestTimeout,
    StageConfig,
    open_pipeline,
)
from tests.pipelines import T, chain_config, fan_config, settled, submit_aborted, talk_config, until_held

S = "toys.stream_stages"


@pytest.mark.parametrize("process", [False, True])
async def test_abort_with_wait_returns_once_every_stage_released(process: bool) -> None:
    config = talk_config(process=process, count=0)
    async with open_pipeline(config, inline=not process) as pipeline:
        outcome: list[BaseException] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(submit_aborted, pipeline, "r", "x", outcome)
            await until_held(pipeline, "b")
            assert await pipeline.abort("r", wait=True) is True
            health = await pipeline.health()
            assert health["requests"] == 0
            assert all(s["active_requests"] == 0 for s in health["stages"].values())
        assert isinstance(outcome[0], RequestAborted)
        assert await pipeline.abort("r", wait=True) is False


async def test_stream_deadline_aborts_everywhere_with_a_timeout_error() -> None:
    config = PipelineConfig(
        stages=[
            StageConfig(name="talker", factory_path=f"{S}.create_producer", factory=FactoryArgs(count=0), terminal=True)
        ]
    )
    async with open_pipeline(config, inline=True) as pipeline:
        with pytest.raises(RequestTimeout):
            async with pipeline.stream("r", "x", timeout=0.2) as stream:
                async for _ in stream:
                    pass
        await settled(pipeline)


async def test_pipeline_default_timeout_applies_to_requests_that_give_none() -> None:
    config = chain_config(1, factory="create_slow")
    config.stages[0].factory = FactoryArgs(seconds=5.0)
    config.default_timeout = 0.1
    async with open_pipeline(config, inline=True) as pipeline:
        started = time.perf_counter()
        with pytest.raises(RequestTimeout, match=r"0\.1 s deadline"):
            await pipeline.submit("r", "x")
        assert time.perf_counter() - started < 2.0
        await settled(pipeline)


async def test_wait_for_fn_that_raises_fails_only_that_request() -> None:
    config = fan_config(wait_for_fn=f"{T}.wait_for_raises")
    async with open_pipeline(config, inline=True) as pipeline:
        with pytest.raises(RequestFailed, match="stage 'join' raised LookupError: wait_for_fn of stage 'join'"):
            await pipeline.submit("r", "a b")
        await settled(pipeline)


async def test_stream_routing_that_raises_fails_only_that_request() -> None:
    config = PipelineConfig(
        stages=[
            StageConfig(
                name="talker",
                factory_path=f"{S}.create_producer",
                factory=FactoryArgs(count=2),
                next="b",
                stream_to=["b"],
                stream_done_to_fn=f"{T}.stream_done_raises",
            ),
            StageConfig(
                name="b", factory_path=f"{S}.create_counter", terminal=True, can_accept_stream_before_payload=True
            ),
        ]
    )
    async with open_pipeline(config, inline=True) as pipeline:
        with pytest.raises(RequestFailed, match="stage 'talker' raised ValueError: stream_done_to_fn"):
            await pipeline.submit("r", "x")
        await settled(pipeline)


@pytest.mark.parametrize("process", [False, True])
async def test_a_scheduler_whose_start_raises_is_restarted_in_place(process: bool) -> None:
    config = chain_config(2, process=process, factory="create_crashing")
    async with open_pipeline(config, inline=not process) as pipeline:
        assert await pipeline.submit("a", "fine") == {"raw_inputs": "fine"}
        with pytest.raises(RequestFailed, match="scheduler crashed: RuntimeError: scheduler loop broke on purpose"):
            await pipeline.submit("b", "crash")
        assert await pipeline.submit("c", "fine again") == {"raw_inputs": "fine again"}
        health = await settled(pipeline)
        assert health["stages"]["s0"]["restarts"] == 1
        assert health["stages"]["s0"]["alive"] is True


@pytest.mark.parametrize("reason", ["failed", "aborted"])
async def test_an_id_that_failed_or_was_aborted_can_be_used_again(reason: str) -> None:
    async with open_pipeline(fan_config(), inline=True) as pipeline:
        if reason == "failed":
            with pytest.raises(RequestFailed):
                await pipeline.submit("r", "boom")
        else:
            with trio.move_on_after(0):
                await pipeline.submit("r", "x")
        await pipeline.abort("r", wait=True)
        assert (await pipeline.submit("r", "now fine"))["upper"] == {"text": "now fine"}
