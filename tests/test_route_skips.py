"""A request is held only where its routes went: one whose routes leave a terminal stage out completes
with the terminals that answered (or fails naming the routing stage when none can answer); an end of
stream goes only to the stream targets the route chose; a fan-in waits only for the sources that can
still arrive.  Inline and in stage processes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio

from omnitrio import FactoryArgs, PipelineConfig, RequestFailed, StageConfig, open_pipeline
from omnitrio.config import validate
from omnitrio.messages import CompleteMessage
from omnitrio.topology import Topology
from tests.pipelines import S, T, settled
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


def test_a_stage_a_route_left_out_is_cut_off_though_the_router_streams_to_it() -> None:
    config = PipelineConfig(
        stages=[
            StageConfig(
                name="thinker",
                factory_path=f"{T}.create_echo",
                next=["detok", "talker"],
                stream_to=["detok", "tap"],
                route_fn=f"{R}.route_router",
            ),
            StageConfig(name="detok", factory_path=f"{T}.create_echo", terminal=True),
            StageConfig(name="talker", factory_path=f"{T}.create_echo", terminal=True),
            StageConfig(name="tap", factory_path=f"{T}.create_echo", terminal=True),
        ]
    )
    validate(config)
    topology = Topology.compile(config)
    assert topology.reach.cut_off((("thinker", ("detok",)),)) == {"detok"}
    assert topology.reach.cut_off((("thinker", ("talker",)),)) == {"talker"}
    plan = topology.plans["thinker"]
    # Its end of stream goes to the stream target it routed to, and to the one only its stream reaches.
    assert plan.stream_done_targets("r", None, plan.choice(["talker"])) == ("tap",)
    assert plan.stream_done_targets("r", None, plan.choice(["detok"])) == ("detok", "tap")


# -- an end of stream goes only where the route went -------------------------------------------------


def own_process(name: str, factory_path: str, process: bool, **options: Any) -> StageConfig:
    """A stage in a process of its own (``process=True``) or inline."""
    return StageConfig(name=name, process=f"p_{name}" if process else None, factory_path=factory_path, **options)


def counter(name: str, process: bool, **options: Any) -> StageConfig:
    """A stage that takes a stream before its payload and answers once both ended (a Counter)."""
    return own_process(name, f"{S}.create_counter", process, can_accept_stream_before_payload=True, **options)


def thinker_shape(process: bool) -> PipelineConfig:
    """Qwen3-Omni's thinker: it streams to and routes to decode (terminal) and/or talker → code2wav
    (terminal); which, and which terminals the request waits for, its inputs say."""
    return PipelineConfig(
        terminal_stages_fn=f"{R}.terminals_from_inputs",
        stages=[
            own_process(
                "thinker",
                f"{R}.create_targeted_streamer",
                process,
                next=["decode", "talker"],
                stream_to=["decode", "talker"],
                route_fn=f"{R}.route_router",
            ),
            counter("decode", process, terminal=True),
            counter("talker", process, next="code2wav"),
            own_process("code2wav", f"{T}.create_echo", process, terminal=True),
        ],
    )


def streamed_terminals(process: bool) -> PipelineConfig:
    """router streams to and routes to a and/or b, both terminal; no terminal_stages_fn."""
    return PipelineConfig(
        stages=[
            own_process(
                "router",
                f"{R}.create_targeted_streamer",
                process,
                next=["a", "b"],
                stream_to=["a", "b"],
                route_fn=f"{R}.route_router",
            ),
            counter("a", process, terminal=True),
            counter("b", process, terminal=True),
        ]
    )


@pytest.mark.parametrize("process", [False, True], ids=["inline", "processes"])
async def test_a_text_only_request_leaves_nothing_held_at_the_talker_its_route_left_out(process: bool) -> None:
    async with open_pipeline(thinker_shape(process)) as pipeline:
        with trio.fail_after(GUARD_S):
            text = {"router": ["decode"], "stream": ["decode"], "terminals": ["decode"]}
            assert (await pipeline.submit("r1", text))["chunk_ids"] == [0, 1, 2]
            await settled(pipeline)  # the thinker's end of stream did not start a request at the talker
            both = {"router": ["decode", "talker"], "stream": ["decode", "talker"], "terminals": ["decode", "code2wav"]}
            result = await pipeline.submit("r1", both)
            assert result["decode"]["chunk_ids"] == [0, 1, 2]
            assert result["code2wav"]["chunk_ids"] == [0, 1, 2]
            await settled(pipeline)


@pytest.mark.parametrize("process", [False, True], ids=["inline", "processes"])
async def test_a_terminal_that_is_also_a_stream_target_is_not_awaited_once_routed_away(process: bool) -> None:
    async with open_pipeline(streamed_terminals(process)) as pipeline:
        with trio.fail_after(GUARD_S):
            result = await pipeline.submit("r1", {"router": "a", "stream": ["a"]})
            assert list(result) == ["a"] and result["a"]["done"] is True
            await settled(pipeline)
            # It streamed to b as well before its route left b out: b lets go of those chunks.
            result = await pipeline.submit("r1", {"router": "b", "stream": ["a", "b"]})
            assert list(result) == ["b"] and result["b"]["chunk_ids"] == [0, 1, 2]
            await settled(pipeline)


def shared_stream_target(process: bool) -> PipelineConfig:
    """split → r and s, both routing; r streams to a; r routes to a or m, s to a or n (all terminal)."""
    return PipelineConfig(
        stages=[
            own_process("split", f"{T}.create_echo", process, next=["r", "s"]),
            own_process(
                "r",
                f"{R}.create_targeted_streamer",
                process,
                next=["a", "m"],
                stream_to=["a"],
                route_fn=f"{R}.route_router",
            ),
            own_process("s", f"{T}.create_echo", process, next=["a", "n"], route_fn=f"{R}.route_y"),
            counter("a", process, terminal=True),
            own_process("m", f"{T}.create_echo", process, terminal=True),
            own_process("n", f"{T}.create_echo", process, terminal=True),
        ]
    )


@pytest.mark.parametrize("process", [False, True], ids=["inline", "processes"])
async def test_a_stream_left_where_another_stage_could_have_sent_the_payload_is_let_go_at_completion(
    process: bool,
) -> None:
    async with open_pipeline(shared_stream_target(process)) as pipeline:
        with trio.fail_after(GUARD_S):
            result = await pipeline.submit("r1", {"router": "m", "y": "n", "stream": ["a"]})
            assert sorted(result) == ["m", "n"]
            await settled(pipeline)  # a got r's stream, and no payload from either
            result = await pipeline.submit("r1", {"router": "m", "y": "a", "stream": ["a"]})
            assert sorted(result) == ["a", "m"] and result["a"]["chunk_ids"] == [0, 1, 2]
            await settled(pipeline)


# -- a fan-in waits only for the sources that can still arrive --------------------------------------


def routed_fan_in(process: bool, **join: Any) -> PipelineConfig:
    """split routes to b and/or c (as its inputs say); join waits for b and c."""
    return PipelineConfig(
        stages=[
            own_process("split", f"{T}.create_echo", process, next=["b", "c"], route_fn=f"{R}.route_router"),
            own_process("b", f"{T}.create_echo", process, next="join"),
            own_process("c", f"{T}.create_echo", process, next="join"),
            own_process("join", f"{T}.create_echo", process, terminal=True, wait_for=["b", "c"], **join),
        ]
    )


@pytest.mark.parametrize("process", [False, True], ids=["inline", "processes"])
@pytest.mark.parametrize("wait_for_fn", [None, f"{R}.every_source"], ids=["wait_for", "wait_for_fn"])
async def test_a_fan_in_completes_with_the_sources_the_route_left_it(process: bool, wait_for_fn: str | None) -> None:
    config = routed_fan_in(process, merge_fn=f"{T}.merge_by_name", wait_for_fn=wait_for_fn)
    async with open_pipeline(config) as pipeline:
        with trio.fail_after(GUARD_S):
            assert (await pipeline.submit("r1", {"router": "b"}))["sources"] == ["b"]
            await settled(pipeline)
            assert (await pipeline.submit("r1", {"router": ["b", "c"]}))["sources"] == ["b", "c"]
            assert (await pipeline.submit("r1", {"router": "c"}))["sources"] == ["c"]
            await settled(pipeline)


@pytest.mark.parametrize("process", [False, True], ids=["inline", "processes"])
async def test_a_merge_that_needs_a_routed_away_source_fails_naming_the_fan_in_and_the_route(process: bool) -> None:
    async with open_pipeline(routed_fan_in(process, merge_fn=f"{R}.merge_both")) as pipeline:
        with trio.fail_after(GUARD_S):
            with pytest.raises(RequestFailed) as info:
                await pipeline.submit("r1", {"router": "b"})
            assert info.value.stage == "join"
            assert "merge_fn of stage 'join'" in str(info.value)
            assert "stage 'split' routed this request away from ['c']" in str(info.value)
            await settled(pipeline)
            assert await pipeline.submit("r1", {"router": ["b", "c"]}) == {
                "b": {"raw_inputs": {"router": ["b", "c"]}},
                "c": {"raw_inputs": {"router": ["b", "c"]}},
            }


def late_cut(process: bool, gate: Path) -> PipelineConfig:
    """split → b → join, and → r2 (a gate, routing) → c → join or → x; join expects only b."""
    return PipelineConfig(
        stages=[
            own_process("split", f"{T}.create_echo", process, next=["b", "r2"]),
            own_process("b", f"{T}.create_echo", process, next="join"),
            own_process(
                "r2",
                f"{R}.create_gate",
                process,
                factory=FactoryArgs(fifo=str(gate)),
                next=["c", "x"],
                route_fn=f"{R}.route_router",
            ),
            own_process("c", f"{T}.create_echo", process, next="join"),
            own_process(
                "join",
                f"{T}.create_echo",
                process,
                terminal=True,
                wait_for=["b", "c"],
                wait_for_fn=f"{R}.source_b_only",
                merge_fn=f"{T}.merge_by_name",
            ),
            own_process("x", f"{T}.create_echo", process, terminal=True),
        ]
    )


@pytest.mark.parametrize("process", [False, True], ids=["inline", "processes"])
async def test_a_fan_in_told_of_a_cut_source_after_it_ran_holds_nothing(process: bool, tmp_path: Path) -> None:
    fifo = tmp_path / "gate"
    os.mkfifo(fifo)

    def open_gate() -> None:
        with open(fifo, "wb") as gate:
            gate.write(b"x")

    async with open_pipeline(late_cut(process, fifo)) as pipeline:
        with trio.fail_after(GUARD_S):
            async with pipeline.stream("r1", {"router": "x"}) as stream:
                first = await stream.__anext__()
                assert isinstance(first, CompleteMessage) and first.from_stage == "join"
                await trio.to_thread.run_sync(open_gate)  # r2 routes away from c only now
                rest = [msg.from_stage async for msg in stream]
            assert rest == ["x"]
            await settled(pipeline)
