"""A request whose routes leave a terminal stage out completes with the terminals that answered,
or fails naming the routing stage when none can answer; inline and in a stage process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from omnitrio import FactoryArgs, PipelineConfig, RequestFailed, StageConfig, open_pipeline
from omnitrio.config import validate
from omnitrio.messages import CompleteMessage
from omnitrio.topology import Topology
from tests.pipelines import T, settled
from tests.route_stages import R

GUARD_S = 20
"""A generous bound: the bug this guards against is waiting forever."""


def tag(name: str, process: bool) -> StageConfig:
    return StageConfig(
        name=name,
        process="p_route" if process else None,
        factory_path=f"{T}.create_tag",
        factory=FactoryArgs(tag=name),
        terminal=True,
    )


def two_terminals(process: bool) -> PipelineConfig:
    """router → a | b, both terminal, the route chosen by the request's inputs."""
    router = StageConfig(
        name="router",
        process="p_route" if process else None,
        factory_path=f"{T}.create_echo",
        next=["a", "b"],
        route_fn=f"{R}.route_router",
    )
    return PipelineConfig(stages=[router, tag("a", process), tag("b", process)])


def fan_out(process: bool, fifo: Path) -> PipelineConfig:
    """split → x and y; x routes to t or u, y (a gate the test opens) to t or v."""
    where = "p_route" if process else None
    return PipelineConfig(
        stages=[
            StageConfig(name="split", process=where, factory_path=f"{T}.create_echo", next=["x", "y"]),
            StageConfig(
                name="x", process=where, factory_path=f"{T}.create_echo", next=["t", "u"], route_fn=f"{R}.route_x"
            ),
            StageConfig(
                name="y",
                process=where,
                factory_path=f"{R}.create_gate",
                factory=FactoryArgs(fifo=str(fifo)),
                next=["t", "v"],
                route_fn=f"{R}.route_y",
            ),
            tag("t", process),
            tag("u", process),
            tag("v", process),
        ]
    )


@pytest.mark.parametrize("process", [False, True])
async def test_a_route_to_one_of_two_terminals_returns_that_ones_result(process: bool) -> None:
    async with open_pipeline(two_terminals(process), inline=not process) as pipeline:
        with trio.fail_after(GUARD_S):
            result = await pipeline.submit("r1", {"router": "a"})
        assert list(result) == ["a"]
        assert result["a"]["path"] == ["a"]
        await settled(pipeline)


@pytest.mark.parametrize("process", [False, True])
async def test_a_stream_routed_to_one_terminal_ends_after_its_result(process: bool) -> None:
    async with open_pipeline(two_terminals(process), inline=not process) as pipeline:
        with trio.fail_after(GUARD_S):
            async with pipeline.stream("r1", {"router": "b"}) as stream:
                received = [msg async for msg in stream]
        assert [(type(m), m.from_stage) for m in received] == [(CompleteMessage, "b")]


@pytest.mark.parametrize("process", [False, True])
async def test_a_route_away_from_every_awaited_terminal_fails_naming_the_stage(process: bool) -> None:
    config = two_terminals(process)
    config.terminal_stages_fn = f"{R}.only_b"
    async with open_pipeline(config, inline=not process) as pipeline:
        with trio.fail_after(GUARD_S), pytest.raises(RequestFailed) as info:
            await pipeline.submit("r1", {"router": "a"})
        assert info.value.stage == "router"
        assert "left out ['b']" in str(info.value)
        await settled(pipeline)
        with trio.fail_after(GUARD_S):
            assert (await pipeline.submit("r2", {"router": "b"}))["path"] == ["b"]


@pytest.mark.parametrize("process", [False, True])
async def test_a_terminal_one_branch_skips_is_still_awaited_while_another_branch_can_reach_it(
    process: bool, tmp_path: Path
) -> None:
    fifo = tmp_path / "gate"
    os.mkfifo(fifo)

    def open_gate() -> None:
        with open(fifo, "wb") as gate:
            gate.write(b"x")

    async with open_pipeline(fan_out(process, fifo), inline=not process) as pipeline:
        with trio.fail_after(GUARD_S):
            async with pipeline.stream("r1", {"x": "u", "y": "t"}) as stream:
                first = await stream.__anext__()  # x skipped t before u answered; y holds at the gate
                assert isinstance(first, CompleteMessage) and first.from_stage == "u"
                await trio.to_thread.run_sync(open_gate)
                rest = [msg async for msg in stream]
        assert [m.from_stage for m in rest] == ["t"]
        assert sorted(stream.result) == ["t", "u"]
        await settled(pipeline)


def test_a_route_that_keeps_every_terminal_reachable_tells_the_coordinator_nothing() -> None:
    config = PipelineConfig(
        stages=[
            StageConfig(name="router", factory_path=f"{T}.create_echo", next=["p", "q"], route_fn=f"{R}.route_router"),
            StageConfig(name="p", factory_path=f"{T}.create_echo", next="t", route_fn=f"{R}.route_router"),
            StageConfig(name="q", factory_path=f"{T}.create_echo", next="t", route_fn=f"{R}.route_router"),
            StageConfig(name="t", factory_path=f"{T}.create_echo", terminal=True),
        ]
    )
    validate(config)
    plan = Topology.compile(config).plans["router"]
    assert plan.left_out(["p"]) == ()
    assert plan.left_out(["q"]) == ()
    plan_two = Topology.compile(two_terminals(False)).plans["router"]
    assert plan_two.left_out(["a"]) == ("b",)


def test_a_terminal_a_stage_streams_to_is_not_cut_off_by_that_stages_route() -> None:
    config = PipelineConfig(
        stages=[
            StageConfig(
                name="thinker",
                factory_path=f"{T}.create_echo",
                next=["detok", "talker"],
                stream_to=["detok"],
                route_fn=f"{R}.route_router",
            ),
            StageConfig(name="detok", factory_path=f"{T}.create_echo", terminal=True),
            StageConfig(name="talker", factory_path=f"{T}.create_echo", terminal=True),
        ]
    )
    validate(config)
    topology = Topology.compile(config)
    assert topology.reach.cut_off((("thinker", ("detok",)),)) == frozenset()
    assert topology.reach.cut_off((("thinker", ("talker",)),)) == {"talker"}
