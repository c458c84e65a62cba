"""Pipelines the core tests share, and what tests of any pipeline look at: :func:`settled` (every stage let
go), :func:`most_held_at_once` (several requests in flight at a stage together, from the event timeline),
:func:`our_shm` (this process's pipelines' shared memory), :func:`streamed_answer` (one request's stream,
collected), :func:`leave_after_audio` (an abort in the middle of a spoken answer)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import trio
import trio.testing

from omnitrio import CompleteMessage, FactoryArgs, PipelineConfig, RequestAborted, StageConfig, StreamMessage
from omnitrio.events import STAGE_ABORTED, STAGE_COMPLETE, STAGE_FAILED, STAGE_INPUT_RECEIVED, Event

T = "toys.stages"
S = "toys.stream_stages"


def fan_config(*, process: bool = False, **join_kw: Any) -> PipelineConfig:
    """words → {upper, count} with projections → join (the seed's experiment 1 shape)."""

    def proc(name: str) -> str | None:
        return f"p_{name}" if process else None

    join = {"wait_for": ["upper", "count"], "merge_fn": f"{T}.merge_by_name", **join_kw}
    return PipelineConfig(
        name="fan",
        stages=[
            StageConfig(
                name="words",
                process=proc("words"),
                factory_path=f"{T}.create_words",
                next=["upper", "count"],
                project_payload={"upper": f"{T}.project_text", "count": f"{T}.project_words"},
            ),
            StageConfig(name="upper", process=proc("upper"), factory_path=f"{T}.create_echo", next="join"),
            StageConfig(name="count", process=proc("count"), factory_path=f"{T}.create_boom", next="join"),
            StageConfig(name="join", process=proc("join"), factory_path=f"{T}.create_echo", terminal=True, **join),
        ],
    )


def chain_config(n: int = 4, *, process: bool = False, factory: str = "create_echo") -> PipelineConfig:
    names = [f"s{i}" for i in range(n)]
    return PipelineConfig(
        name=f"chain{n}",
        stages=[
            StageConfig(
                name=name,
                process=f"p_{name}" if process else None,
                factory_path=f"{T}.{factory}",
                next=None if i == n - 1 else names[i + 1],
                terminal=i == n - 1,
            )
            for i, name in enumerate(names)
        ],
    )


async def submit_aborted(pipeline: Any, request_id: str, inputs: Any, caught: list[BaseException]) -> None:
    """Submit ``inputs``; the :class:`~omnitrio.errors.RequestAborted` it raises goes into ``caught`` (run it
    as a task, abort the request, then look at ``caught``)."""
    try:
        await pipeline.submit(request_id, inputs)
    except RequestAborted as exc:
        caught.append(exc)


def _is_settled(health: dict[str, Any]) -> bool:
    """``health`` says no stage and not the coordinator holds any request."""
    return bool(health["requests"] == 0 and all(s["active_requests"] == 0 for s in health["stages"].values()))


def _still_held(health: dict[str, Any], timeout: float) -> AssertionError:
    """What the coordinator and each stage still held (``health``, the last one seen) after ``timeout`` s."""
    held = {name: s["active_requests"] for name, s in health.get("stages", {}).items() if s["active_requests"]}
    return AssertionError(f"after {timeout} s the coordinator holds {health.get('requests')} requests, stages {held}")


async def settled(pipeline: Any, timeout: float = 5.0) -> dict[str, Any]:
    """Wait until no stage and not the coordinator holds any request; return health().  After ``timeout``
    seconds an ``AssertionError`` says what the coordinator and each stage still held."""
    health: dict[str, Any] = {}
    with trio.move_on_after(timeout):
        while True:
            health = await pipeline.health()
            if _is_settled(health):
                return health
            await trio.sleep(0.002)
    raise _still_held(health, timeout)


async def until_held(pipeline: Any, stage: str, timeout: float = 10.0) -> None:
    """Wait until ``stage`` holds a request: each round lets this process's tasks settle, then asks
    ``health()`` (which waits for stage processes to answer)."""
    with trio.fail_after(timeout):
        while (await pipeline.health())["stages"][stage]["active_requests"] == 0:
            await trio.testing.wait_all_tasks_blocked()


def talk_config(*, accept_early: bool = True, process: bool = False, **producer: object) -> PipelineConfig:
    """talker (a Producer) streams to and then sends its result to ``b`` (a Counter)."""
    return PipelineConfig(
        stages=[
            StageConfig(
                name="talker",
                process="p_talker" if process else None,
                factory_path=f"{S}.create_producer",
                factory=FactoryArgs(**producer),
                next="b",
                stream_to=["b"],
            ),
            StageConfig(
                name="b",
                process="p_b" if process else None,
                factory_path=f"{S}.create_counter",
                terminal=True,
                can_accept_stream_before_payload=accept_early,
            ),
        ]
    )


def endless_config(**producer: object) -> PipelineConfig:
    """One terminal Producer that streams until the request is aborted."""
    factory = FactoryArgs(count=0, **producer)
    stage = StageConfig(name="talker", factory_path=f"{S}.create_producer", factory=factory, terminal=True)
    return PipelineConfig(stages=[stage])


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until ``condition()`` holds, looking again each time this process's tasks have settled."""
    with trio.fail_after(timeout):
        while not condition():
            await trio.testing.wait_all_tasks_blocked(cushion=0.001)


async def settled_server(base_url: str, timeout: float = 30.0) -> dict[str, Any]:
    """Wait until the server at ``base_url`` says (``GET /health``) that no stage and not the
    coordinator holds any request; return that health. After ``timeout`` seconds an ``AssertionError``
    says what the coordinator and each stage still held."""
    health: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=base_url) as client:
        with trio.move_on_after(timeout):
            while True:
                health = (await client.get("/health")).json()
                if _is_settled(health):
                    return health
                await trio.sleep(0.01)
    raise _still_held(health, timeout)


async def until_alive(pipeline: Any, stage: str, timeout: float = 60.0) -> None:
    """Wait until ``health()`` reports ``stage`` alive again (its restarted process said it is ready);
    asked every 50 ms, as the restart happens in other processes."""
    with trio.fail_after(timeout):
        while not (await pipeline.health())["stages"][stage]["alive"]:
            await trio.sleep(0.05)


def most_held_at_once(events: list[Event], stage: str) -> int:
    """The most requests ``stage`` held together, by the order of its events (first input in, until its
    result went on or it failed or let go): several means they were in flight there at the same time."""
    held: set[str | None] = set()
    most = 0
    for event in events:
        if event.stage != stage:
            continue
        if event.event == STAGE_INPUT_RECEIVED:
            held.add(event.request_id)
        elif event.event in (STAGE_COMPLETE, STAGE_FAILED, STAGE_ABORTED):
            held.discard(event.request_id)
        most = max(most, len(held))
    return most


def our_shm() -> set[str]:
    """This process's pipelines' shared-memory files (named for the caller's pid; other runs' are not ours)."""
    ours = f"omnitrio-{os.getpid()}-"
    return {name for name in os.listdir("/dev/shm") if name.startswith(ours)} if os.path.isdir("/dev/shm") else set()


async def streamed_answer(pipeline: Any, request_id: str, inputs: Any) -> dict[str, Any]:
    """Stream one request to its end: ``results`` by stage, its audio chunks' ``pcm`` joined (empty int16
    when none), and its chunks' ``modalities`` in arrival order."""
    pcm: list[np.ndarray] = []
    results: dict[str, Any] = {}
    modalities: list[str | None] = []
    async with pipeline.stream(request_id, inputs) as stream:
        async for message in stream:
            match message:
                case StreamMessage(modality=modality, chunk=chunk):
                    modalities.append(modality)
                    if modality == "audio":
                        pcm.append(np.asarray(chunk["pcm"]))
                case CompleteMessage(from_stage=stage, result=result):
                    results[stage] = result
    joined = np.concatenate(pcm) if pcm else np.zeros(0, np.int16)
    return {"results": results, "pcm": joined, "modalities": modalities}


async def leave_after_audio(pipeline: Any, request_id: str, inputs: Any, *, over_bytes: int = 0) -> set[str]:
    """Stream the request until an audio chunk of more than ``over_bytes`` bytes of pcm arrives, then leave the
    stream (which aborts the request); return :func:`our_shm` as it was then (with ``over_bytes`` the relay's
    inline limit, that chunk came from another process through shared memory)."""
    async with pipeline.stream(request_id, inputs) as stream:
        async for message in stream:
            match message:
                case StreamMessage(modality="audio", chunk=chunk) if np.asarray(chunk["pcm"]).nbytes > over_bytes:
                    return our_shm()
    raise AssertionError(f"{request_id!r} ended before an audio chunk of more than {over_bytes} bytes")
