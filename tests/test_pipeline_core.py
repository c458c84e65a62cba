"""The core runtime in one process: routing, fan-out/fan-in, failures, abort, admission."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from omnitrio import (
    DuplicateRequest,
    FactoryArgs,
    Overloaded,
    PipelineConfig,
    RequestFailed,
    RequestTimeout,
    StageConfig,
    open_pipeline,
)
from omnitrio.errors import StartupError
from tests.pipelines import T, chain_config, fan_config, settled, submit_aborted


async def test_submit_returns_the_terminal_stage_data() -> None:
    async with open_pipeline(chain_config(4), inline=True) as pipeline:
        assert await pipeline.submit("r1", "hi") == {"raw_inputs": "hi"}


async def test_fan_out_targets_see_only_their_projection() -> None:
    async with open_pipeline(fan_config(), inline=True) as pipeline:
        result = await pipeline.submit("r1", "hello omni world")
    assert result["sources"] == ["count", "upper"]
    assert result["upper"] == {"text": "hello omni world"}
    assert result["count"] == {"words": ["hello", "omni", "world"]}


async def test_projection_sharing_a_list_is_copied_before_a_branch_mutates_it() -> None:
    config = fan_config()
    config.stage("words").project_payload = {"upper": f"{T}.project_shared", "count": f"{T}.project_shared"}
    config.stage("upper").factory_path = f"{T}.create_mutating_upper"
    async with open_pipeline(config, inline=True) as pipeline:
        result = await pipeline.submit("r1", "a b")
    assert result["upper"]["words"] == ["a", "b", "MUTATED"]
    assert result["count"]["words"] == ["a", "b"]


async def test_fan_out_without_projection_gives_each_target_its_own_copy() -> None:
    config = fan_config()
    config.stage("words").project_payload = {}
    config.stage("upper").factory_path = f"{T}.create_mutating_upper"
    async with open_pipeline(config, inline=True) as pipeline:
        result = await pipeline.submit("r1", "a b")
    assert result["upper"]["words"] == ["a", "b", "MUTATED"]
    assert result["count"]["words"] == ["a", "b"]


async def test_dynamic_fan_in_waits_only_for_the_routed_branches() -> None:
    config = fan_config(wait_for_fn=f"{T}.wait_by_length")
    config.stage("words").route_fn = f"{T}.route_by_length"
    async with open_pipeline(config, inline=True) as pipeline:
        one = await pipeline.submit("one", "single")
        two = await pipeline.submit("two", "two words")
        assert one["sources"] == ["upper"]
        assert two["sources"] == ["count", "upper"]
        await settled(pipeline)


async def test_compute_failure_names_stage_and_type_and_leaves_no_state() -> None:
    async with open_pipeline(fan_config(), inline=True) as pipeline:
        with pytest.raises(RequestFailed) as info:
            await pipeline.submit("bad", "boom boom")
        assert info.value.stage == "count"
        assert info.value.error_type == "ValueError"
        assert "stage 'count' raised ValueError: count exploded on purpose" in str(info.value)
        health = await settled(pipeline)
        assert health["stages"]["join"]["active_requests"] == 0
        assert (await pipeline.submit("good", "fine words"))["sources"] == ["count", "upper"]


async def test_a_failure_does_not_touch_concurrent_requests() -> None:
    async with open_pipeline(fan_config(), inline=True) as pipeline:
        outcomes: dict[str, object] = {}

        async def run(rid: str, text: str) -> None:
            try:
                outcomes[rid] = await pipeline.submit(rid, text)
            except RequestFailed as exc:
                outcomes[rid] = exc

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(run, f"r{i}", "boom" if i % 3 == 0 else f"ok {i}")
        for i in range(20):
            if i % 3 == 0:
                assert isinstance(outcomes[f"r{i}"], RequestFailed)
            else:
                assert outcomes[f"r{i}"]["upper"] == {"text": f"ok {i}"}  # type: ignore[index]
        await settled(pipeline)


@pytest.mark.parametrize(
    ("where", "patch", "expected"),
    [
        ("route_fn", {"route_fn": f"{T}.route_to_nowhere"}, "route_fn of stage 'words': returned ['nowhere']"),
        ("projection", {"project_payload": {"upper": f"{T}.project_raises"}}, "RuntimeError: project_payload"),
    ],
)
async def test_routing_code_that_fails_fails_only_that_request(where: str, patch: dict, expected: str) -> None:
    config = fan_config()
    for key, value in patch.items():
        setattr(config.stage("words"), key, value)
    async with open_pipeline(config, inline=True) as pipeline:
        with pytest.raises(RequestFailed, match="stage 'words'") as info:
            await pipeline.submit("r1", "boom here")
        assert expected in str(info.value)
        await settled(pipeline)
        if where == "projection":
            assert (await pipeline.submit("r2", "calm"))["upper"] == {"text": "calm"}


async def test_merge_that_raises_fails_the_request_and_frees_the_fan_in() -> None:
    config = fan_config(merge_fn=f"{T}.merge_raises")
    config.stage("count").factory_path = f"{T}.create_echo"
    async with open_pipeline(config, inline=True) as pipeline:
        with pytest.raises(RequestFailed, match="stage 'join' raised ZeroDivisionError: merge_fn of stage 'join'"):
            await pipeline.submit("r1", "boom")
        await settled(pipeline)
        assert (await pipeline.submit("r2", "ok"))["sources"] == ["count", "upper"]


async def test_cancelled_caller_aborts_the_request_at_every_stage() -> None:
    config = chain_config(3)
    config.stages[1].factory_path = f"{T}.create_slow"
    config.stages[1].factory = FactoryArgs(seconds=5.0)
    async with open_pipeline(config, inline=True) as pipeline:
        with trio.move_on_after(0.05):
            await pipeline.submit("r1", "x")
        health = await settled(pipeline, timeout=1.0)
        assert health["requests"] == 0
        assert await pipeline.submit("r1", "again", timeout=10) == {"raw_inputs": "again"}


async def test_abort_reports_whether_it_aborted_and_the_caller_sees_it() -> None:
    config = chain_config(2, factory="create_slow")
    async with open_pipeline(config, inline=True) as pipeline:
        assert await pipeline.abort("unknown") is False
        caught: list[BaseException] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(submit_aborted, pipeline, "r1", "x", caught)
            await trio.testing.wait_all_tasks_blocked()  # r1 waits at the slow stage
            assert await pipeline.abort("r1", wait=True) is True
        assert caught and caught[0].request_id == "r1"
        health = await pipeline.health()
        assert health["requests"] == 0
        assert all(s["active_requests"] == 0 for s in health["stages"].values())
        assert await pipeline.abort("r1") is False
        assert await pipeline.submit("r1", "reused") == {"raw_inputs": "reused"}


async def test_a_live_request_id_is_rejected() -> None:
    async with open_pipeline(chain_config(2, factory="create_slow"), inline=True) as pipeline:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pipeline.submit, "r1", "x")
            await trio.testing.wait_all_tasks_blocked()  # what was started waits at the slow stage
            with pytest.raises(DuplicateRequest, match="'r1' is still live"):
                await pipeline.submit("r1", "y")
            nursery.cancel_scope.cancel()


async def test_deadline_aborts_everywhere_with_a_distinct_error() -> None:
    async with open_pipeline(chain_config(2, factory="create_slow"), inline=True) as pipeline:
        with pytest.raises(RequestTimeout, match=r"0\.05 s deadline"):
            await pipeline.submit("r1", "x", timeout=0.05)
        await settled(pipeline)


async def test_max_in_flight_refuses_at_once_with_overloaded() -> None:
    config = chain_config(1, factory="create_slow")
    config.max_in_flight = 2
    async with open_pipeline(config, inline=True) as pipeline:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pipeline.submit, "a", 1)
            nursery.start_soon(pipeline.submit, "b", 2)
            await trio.testing.wait_all_tasks_blocked()  # what was started waits at the slow stage
            with pytest.raises(Overloaded, match="max_in_flight=2"):
                await pipeline.submit("c", 3)
            nursery.cancel_scope.cancel()


async def test_stage_queue_bound_refuses_with_overloaded() -> None:
    config = chain_config(1, factory="create_slow")
    config.stages[0].max_queue = 1
    async with open_pipeline(config, inline=True) as pipeline:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pipeline.submit, "a", 1)
            await trio.testing.wait_all_tasks_blocked()  # what was started waits at the slow stage
            with pytest.raises(Overloaded, match=r"stage 's0': stage queue is full \(1 requests\)"):
                await pipeline.submit("b", 2)
            nursery.cancel_scope.cancel()


async def test_several_terminals_return_a_dict() -> None:
    config = PipelineConfig(
        stages=[
            StageConfig(name="a", factory_path=f"{T}.create_echo", next=["b", "c"]),
            StageConfig(name="b", factory_path=f"{T}.create_tag", factory=FactoryArgs(tag="b"), terminal=True),
            StageConfig(name="c", factory_path=f"{T}.create_tag", factory=FactoryArgs(tag="c"), terminal=True),
        ]
    )
    async with open_pipeline(config, inline=True) as pipeline:
        result = await pipeline.submit("r", "x")
    assert {stage: data["path"] for stage, data in result.items()} == {"b": ["b"], "c": ["c"]}


async def test_factory_that_raises_fails_open_pipeline_with_the_stage_name() -> None:
    config = chain_config(2)
    config.stages[1].factory_path = f"{T}.create_raises_on_build"
    with pytest.raises(StartupError, match=r"stage 's1': factory toys\.stages\.create_raises_on_build raised"):
        async with open_pipeline(config, inline=True):
            pass


async def test_health_reports_every_stage() -> None:
    async with open_pipeline(chain_config(2), inline=True) as pipeline:
        health = await pipeline.health()
    assert set(health["stages"]) == {"s0", "s1"}
    assert health["stages"]["s0"]["alive"] is True
    assert health["stages"]["s0"]["restarts"] == 0


async def test_params_and_metadata_reach_every_stage() -> None:
    async with open_pipeline(chain_config(2, factory="create_request_echo"), inline=True) as pipeline:
        seen = await pipeline.submit("r", "x", params={"stream": True}, metadata={"session": {"op": "open"}})
    assert seen == {"inputs": "x", "params": {"stream": True}, "metadata": {"session": {"op": "open"}}}


async def test_a_burst_larger_than_the_inbox_depth_still_forms_one_batch() -> None:
    async with open_pipeline(chain_config(1, factory="create_batch_size_reporter"), inline=True) as pipeline:
        sizes: list[int] = []

        async def one(i: int) -> None:
            sizes.append((await pipeline.submit(f"r{i}", i))["batch"])

        async with trio.open_nursery() as nursery:
            for i in range(64):  # all 64 reach the stage in one pass of the loop
                nursery.start_soon(one, i)
    assert sizes == [64] * 64
