"""A request id aborted mid-request is usable again at once, at every scheduler family, in both modes;
so is one that completed while a side stage still worked on it (completion lets every stage go), and
an input for an id a stage still holds from another life is an error its caller sees.

The runtime releases an aborted id everywhere before it may be reused; what makes reuse work at a
scheduler is that the in-order ``abort`` message in its inbox ends the old life there, so a stage
that accepts stream data before its payload takes the new life's first chunks as the new life's
(before, they were dropped as the aborted life's late chunks and the request hung).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from omnitrio import (
    CompleteMessage,
    FactoryArgs,
    PipelineConfig,
    RequestAborted,
    RequestFailed,
    StageConfig,
    StreamMessage,
    open_pipeline,
)
from omnitrio.caller import Submission
from tests.pipelines import settled, until_held

R = "tests.reuse_stages"
AR = "tests.reuse_ar_stages"
SEED = "toys.seed.ch4_stream_stages"
TOYS = "toys.stages"
DEADLINE = 60  # a hang fails the test instead of the suite
CHUNKS_BEFORE_ABORT = 20


def stage(name: str, factory: str, process: bool | str, **options: Any) -> StageConfig:
    """A stage in its own process (``process=True``), in the named one, or inline (False)."""
    path = factory if "." in factory else f"{R}.{factory}"
    where = process if isinstance(process, str) else f"p_{name}" if process else None
    return StageConfig(name=name, factory_path=path, process=where, **options)


def streamed_into(
    consumer: str, producer: str = "create_streamer", *, torch: bool = False
) -> Callable[[bool], PipelineConfig]:
    """producer --stream_to--> consumer (terminal, takes stream data before its payload).

    Stages that import torch share one process (each start imports it again, slowly)."""

    def config(process: bool) -> PipelineConfig:
        where = "p_torch" if process and torch else process
        return PipelineConfig(
            stages=[
                stage("producer", producer, where, next="consumer", stream_to=["consumer"]),
                stage("consumer", consumer, where, terminal=True, can_accept_stream_before_payload=True),
            ]
        )

    return config


def alone(factory: str) -> Callable[[bool], PipelineConfig]:
    return lambda process: PipelineConfig(stages=[stage("only", factory, process, terminal=True)])


@attrs.frozen
class Life:
    inputs: Any
    params: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class StreamingCase:
    """First life streams until aborted after 20 chunks; the second must run to completion."""

    config: Callable[[bool], PipelineConfig]
    first: Life
    second: Life
    check: Callable[[Any, int], bool]
    in_processes: bool = True
    """False for the second pipeline of a family already run in processes (torch starts slowly)."""


STREAMING_CASES = {
    "seed-talker-vocoder": StreamingCase(
        streamed_into(f"{SEED}.create_vocoder", f"{AR}.create_seed_talker", torch=True),
        Life("say something"),
        Life("say something"),
        # The seed's vocoder keeps what it decoded for an aborted request (it has no clear_stream_state).
        lambda result, chunks: result["total_samples"] >= 400 and chunks == 200,
        in_processes=False,
    ),
    "streaming": StreamingCase(
        streamed_into("create_relay"),
        Life({"count": 0}),
        Life({"count": 30}),
        lambda result, chunks: result == {"chunks": 30} and chunks == 30,
    ),
    "vocoder-base": StreamingCase(
        streamed_into("create_token_vocoder"),
        Life({"count": 0}),
        Life({"count": 30}),
        lambda result, chunks: result == {"sent": 30} and chunks >= 1,
    ),
    "detokenize": StreamingCase(
        streamed_into("create_detokenizer"),
        Life({"count": 0}),
        Life({"count": 30}),
        lambda result, chunks: result == {"text": "abcdefghijklmnopqrstuvwxyzabcd"},
    ),
    "ar": StreamingCase(
        alone(f"{AR}.create_tiny_ar"),
        Life([1, 2, 3], {"max_new_tokens": 400, "ignore_eos": True}),
        Life([1, 2, 3], {"max_new_tokens": 5, "ignore_eos": True}),
        lambda result, chunks: len(result["output_token_ids"]) == 5 and chunks == 5,
    ),
}


async def stream_then_abort(pipeline: Any, rid: str, life: Life) -> None:
    seen = 0
    async with pipeline.stream(rid, life.inputs, params=life.params) as stream:
        async for msg in stream:
            assert isinstance(msg, StreamMessage), f"the first life ended before it was aborted: {msg!r}"
            seen += 1
            if seen == CHUNKS_BEFORE_ABORT:
                assert await pipeline.abort(rid, wait=True)
                break


async def run_to_completion(pipeline: Any, rid: str, life: Life) -> tuple[Any, int]:
    chunks, result = 0, None
    async for msg in pipeline.stream(rid, life.inputs, params=life.params):
        match msg:
            case StreamMessage():
                chunks += 1
            case CompleteMessage(result=data):
                result = data
    return result, chunks


@pytest.mark.parametrize(
    ("family", "process"),
    [
        pytest.param(family, process, id=f"{family}-{'processes' if process else 'inline'}")
        for family, case in STREAMING_CASES.items()
        for process in (False, True)
        if case.in_processes or not process
    ],
)
async def test_id_aborted_mid_stream_streams_again(family: str, process: bool) -> None:
    case = STREAMING_CASES[family]
    async with open_pipeline(case.config(process), inline=not process) as pipeline:
        with trio.fail_after(DEADLINE):
            await stream_then_abort(pipeline, "s1", case.first)
            result, chunks = await run_to_completion(pipeline, "s1", case.second)
            assert case.check(result, chunks), (result, chunks)
            await settled(pipeline)


COMPUTE_FAMILIES = {
    "simple": "create_simple",
    "batching": "create_batching",
    "threaded": "create_threaded",
    "batch-vocoder-base": "create_batch_vocoder",
}


@pytest.mark.parametrize("process", [False, True], ids=["inline", "processes"])
@pytest.mark.parametrize("family", list(COMPUTE_FAMILIES))
async def test_id_aborted_mid_compute_runs_again(family: str, process: bool) -> None:
    config = alone(COMPUTE_FAMILIES[family])(process)
    async with open_pipeline(config, inline=not process) as pipeline:
        with trio.fail_after(DEADLINE):
            async with trio.open_nursery() as nursery:

                async def first_life() -> None:
                    with pytest.raises(RequestAborted):
                        await pipeline.submit("r1", {"sleep": 0.5, "tag": "first"})

                nursery.start_soon(first_life)
                await until_held(pipeline, "only")
                assert await pipeline.abort("r1", wait=True)
            assert await pipeline.submit("r1", {"sleep": 0, "tag": "second"}) == {"tag": "second"}
            await settled(pipeline)


def command(op: str, **fields: Any) -> dict[str, Any]:
    return {"session": {"op": op, "session_id": "talk", **fields}}


@pytest.mark.parametrize("process", [False, True], ids=["inline", "processes"])
async def test_session_command_id_aborted_mid_append_runs_again(process: bool) -> None:
    async with open_pipeline(alone("create_session")(process), inline=not process) as pipeline:
        with trio.fail_after(DEADLINE):
            await pipeline.submit("open", None, metadata=command("open"))
            seen = 0
            async with pipeline.stream("a1", None, metadata=command("append", chunk=400)) as stream:
                async for _ in stream:
                    seen += 1
                    if seen == CHUNKS_BEFORE_ABORT:
                        assert await pipeline.abort("a1", wait=True)
                        break
            result, ticks = None, 0
            async for msg in pipeline.stream("a1", None, metadata=command("append", chunk=3)):
                match msg:
                    case StreamMessage():
                        ticks += 1
                    case CompleteMessage(result=data):
                        result = data
            assert (result["op"], result["ticks"], ticks) == ("append", 3, 3)
            closed = await pipeline.submit("close", None, metadata=command("close"))
            assert closed["appends"] == [400, 3]
            await settled(pipeline)


# -- completion lets every stage go; a clash is an error ---------------------------------------------

ROUTES = "tests.route_stages"


def side_branch(process: bool, gate: Path) -> PipelineConfig:
    """split → fast (terminal) and → side (a gate the test opens) → side_t (terminal); the request's
    inputs name the terminals it waits for."""
    return PipelineConfig(
        terminal_stages_fn=f"{ROUTES}.terminals_from_inputs",
        stages=[
            stage("split", f"{TOYS}.create_echo", process, next=["fast", "side"]),
            stage("fast", f"{TOYS}.create_echo", process, terminal=True),
            StageConfig(
                name="side",
                process="p_side" if process else None,
                factory_path=f"{ROUTES}.create_gate",
                factory=FactoryArgs(fifo=str(gate)),
                next="side_t",
            ),
            stage("side_t", f"{TOYS}.create_echo", process, terminal=True),
        ],
    )


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    """A named pipe for the side stage's gate."""
    fifo = tmp_path / "gate"
    os.mkfifo(fifo)
    return fifo


def pass_one(fifo: Path) -> bool:
    """Let one payload through the gate if a compute waits at it; False if none does."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no reader
            return False
        raise
    try:
        os.write(fd, b"x")
    except BrokenPipeError:  # the reader took an earlier byte and left
        return False
    finally:
        os.close(fd)
    return True


async def answered_through_gate(pipeline: Any, fifo: Path, rid: str, inputs: Any) -> Any:
    """Submit, letting computes through the gate (an earlier life's too, if its compute started)
    until the request has answered."""
    answers: list[Any] = []
    async with trio.open_nursery() as nursery:

        async def submit() -> None:
            answers.append(await pipeline.submit(rid, inputs))
            nursery.cancel_scope.cancel()

        nursery.start_soon(submit)
        while True:
            if not pass_one(fifo):
                await trio.sleep(0.01)  # a compute reaches the gate from the scheduler's thread
    return answers[0]


@pytest.mark.parametrize("process", [False, True], ids=["inline", "processes"])
async def test_completion_releases_a_side_stage_still_working_and_the_id_runs_again_at_once(
    process: bool, gate: Path
) -> None:
    async with open_pipeline(side_branch(process, gate)) as pipeline:
        with trio.fail_after(DEADLINE):
            first = await pipeline.submit("r1", {"terminals": ["fast"]})
            assert first == {"raw_inputs": {"terminals": ["fast"]}}
            # side still holds the first life: it is told to let go, and the same id runs at once
            second = await answered_through_gate(pipeline, gate, "r1", {"terminals": ["side_t"]})
            assert second == {"raw_inputs": {"terminals": ["side_t"]}}
            await settled(pipeline)


@pytest.mark.parametrize("process", [False, True], ids=["inline", "processes"])
async def test_an_input_for_an_id_a_stage_still_holds_from_another_life_fails_naming_stage_and_id(
    process: bool, gate: Path
) -> None:
    async with open_pipeline(side_branch(process, gate)) as pipeline:
        with trio.fail_after(DEADLINE):
            leaked = pipeline.coordinator.open(Submission("r1", {"terminals": ["side_t"]}))
            await until_held(pipeline, "side")
            while (await pipeline.health())["stages"]["fast"]["active_requests"]:
                await trio.sleep(0.01)  # fast answers it (unheard): only side holds it now
            leaked.close(RequestAborted("r1"))  # the coordinator forgets it; side still holds it
            with pytest.raises(RequestFailed) as info:
                await pipeline.submit("r1", {"terminals": ["side_t"]})
            assert info.value.stage == "side"
            assert "'r1'" in info.value.error_message and "still holds" in info.value.error_message
            await settled(pipeline)  # the clash let the earlier life go too
            again = await answered_through_gate(pipeline, gate, "r1", {"terminals": ["side_t"]})
            assert again == {"raw_inputs": {"terminals": ["side_t"]}}  # and the id works again
            await settled(pipeline)
