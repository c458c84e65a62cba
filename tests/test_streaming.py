"""Streams between stages and to the caller: order, end signals, refusal, flow control."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from omnitrio import (
    CompleteMessage,
    FactoryArgs,
    PipelineConfig,
    RequestFailed,
    StageConfig,
    StreamMessage,
    open_pipeline,
)
from omnitrio.bridge import INBOX_DEPTH
from omnitrio.flow import BACKLOG_HIGH, STREAM_WINDOW
from tests.held_stages import H
from tests.pipelines import S, endless_config, settled, talk_config, until


async def test_end_of_stream_before_the_payload_completes_when_the_payload_arrives() -> None:
    async with open_pipeline(talk_config(count=5), inline=True) as pipeline:
        result = await pipeline.submit("r", "x")
    assert result["chunk_ids"] == [0, 1, 2, 3, 4]
    assert result["events"] == ["done-before-payload", "payload", "done"]


async def test_only_the_chosen_stream_target_gets_the_end_signal() -> None:
    config = PipelineConfig(
        stages=[
            StageConfig(
                name="talker",
                factory_path=f"{S}.create_producer",
                factory=FactoryArgs(count=3),
                next=["b", "c"],
                stream_to=["b", "c"],
                stream_done_to_fn=f"{S}.done_only_to_b",
            ),
            StageConfig(
                name="b", factory_path=f"{S}.create_counter", terminal=True, can_accept_stream_before_payload=True
            ),
            StageConfig(
                name="c",
                factory_path=f"{S}.create_counter",
                factory=FactoryArgs(streaming=False),
                terminal=True,
                can_accept_stream_before_payload=True,
            ),
        ]
    )
    async with open_pipeline(config, inline=True) as pipeline:
        result = await pipeline.submit("r", "x")
    assert result["b"]["done"] is True and result["b"]["chunk_ids"] == [0, 1, 2]
    assert result["c"]["done"] is False and result["c"]["chunk_ids"] == [0, 1, 2]


async def test_stream_before_payload_is_refused_when_not_allowed() -> None:
    async with open_pipeline(talk_config(accept_early=False, count=2), inline=True) as pipeline:
        with pytest.raises(RequestFailed, match="can_accept_stream_before_payload=false") as info:
            await pipeline.submit("r", "x")
        assert info.value.stage == "b"
        await settled(pipeline)


@pytest.mark.parametrize("process", [False, True])
async def test_terminal_stream_reaches_the_caller_in_order_then_complete(process: bool) -> None:
    config = PipelineConfig(
        stages=[
            StageConfig(
                name="talker",
                process="p_talker" if process else None,
                factory_path=f"{S}.create_producer",
                factory=FactoryArgs(count=200),
                terminal=True,
            )
        ]
    )
    async with open_pipeline(config, inline=not process) as pipeline:
        got: list[StreamMessage | CompleteMessage] = []
        async with pipeline.stream("r", "x") as stream:
            async for msg in stream:
                got.append(msg)
    chunks = [m for m in got if isinstance(m, StreamMessage)]
    assert [m.chunk_id for m in chunks] == list(range(200))
    assert [m.chunk["i"] for m in chunks] == list(range(200))
    assert {m.modality for m in chunks} == {"test"}
    assert isinstance(got[-1], CompleteMessage) and got[-1].result == {"sent": 200}


async def test_leaving_a_stream_early_aborts_the_request_everywhere() -> None:
    async with open_pipeline(endless_config(), inline=True) as pipeline:
        async with pipeline.stream("r", "x") as stream:
            async for _ in stream:
                break
        await settled(pipeline)


async def test_one_requests_backlog_does_not_delay_anothers_first_chunk() -> None:
    produced = threading.Event()
    config = endless_config()
    config.stages[0].factory_path = f"{H}.create_noted_producer"
    config.stages[0].factory = FactoryArgs(produced=produced, count=600, outbox_size=1000)
    async with open_pipeline(config, inline=True) as pipeline:
        async with pipeline.stream("hog", "x") as hog:
            await hog.__anext__()  # 600 chunks come; nobody reads them
            await trio.to_thread.run_sync(produced.wait)
            with trio.fail_after(5):
                async with pipeline.stream("other", "y") as other:
                    first = await other.__anext__()
            assert isinstance(first, StreamMessage) and first.request_id == "other"


def held_config(release: threading.Event) -> PipelineConfig:
    """talker (a Producer) streams to ``b``, which holds the first chunk it ever gets until ``release``."""
    config = talk_config()
    config.stages[1].factory_path = f"{H}.create_held_recorder"
    config.stages[1].factory = FactoryArgs(release=release)
    return config


def b_gauge(pipeline: Any, name: str) -> float:
    return pipeline.metrics_registry.get_sample_value(f"omnitrio_stage_{name}", {"stage": "b"}) or 0.0


async def test_a_slow_stage_holds_its_producer_back_instead_of_queueing_without_bound() -> None:
    release = threading.Event()
    async with open_pipeline(held_config(release), inline=True) as pipeline:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pipeline.submit, "endless", 0)  # streams until aborted
                await until(lambda: b_gauge(pipeline, "queue_depth") >= STREAM_WINDOW - 1)  # b holds chunk 0
                # An unthrottled talker would keep the loop busy forwarding chunks to b, never settling.
                with trio.move_on_after(5):
                    await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                depth = b_gauge(pipeline, "queue_depth")
                nursery.cancel_scope.cancel()
        finally:
            release.set()
    assert depth <= STREAM_WINDOW + INBOX_DEPTH


async def test_a_late_requests_chunks_do_not_wait_behind_another_requests_backlog() -> None:
    release = threading.Event()
    async with open_pipeline(held_config(release), inline=True) as pipeline:
        try:
            async with trio.open_nursery() as nursery:
                # Fewer chunks than BACKLOG_HIGH: the talker's one outbox is never paused for hog.
                nursery.start_soon(pipeline.submit, "hog", BACKLOG_HIGH - 100)
                # b holds hog's first chunk; a window of its next ones piles up behind it, more than
                # b's inbox takes, so a queue in arrival order would put late's first chunk after them.
                await until(lambda: b_gauge(pipeline, "queue_depth") >= STREAM_WINDOW - 1)
                late: dict[str, Any] = {}

                async def submit_late() -> None:
                    late.update(await pipeline.submit("late", 3))

                nursery.start_soon(submit_late)
                await until(lambda: b_gauge(pipeline, "active_requests") == 2)  # late's first chunk is at b
                release.set()
                with trio.fail_after(10):
                    while not late:
                        await trio.testing.wait_all_tasks_blocked(cushion=0.001)
                nursery.cancel_scope.cancel()
        finally:
            release.set()
    # b finishes what its inbox held when it stalled, then takes turns between requests.
    assert late["first_chunk_at"] <= INBOX_DEPTH + 4


@pytest.mark.parametrize("process", [False, True], ids=["inline", "processes"])
async def test_a_consumer_that_fails_mid_stream_frees_its_waiting_producer(process: bool) -> None:
    config = talk_config(process=process)
    config.stages[1].factory = FactoryArgs(fail_at_chunk=5)
    async with open_pipeline(config, inline=not process) as pipeline:
        with trio.fail_after(10), pytest.raises(RequestFailed, match="not what I wanted") as failed:
            await pipeline.submit("r", 50 * STREAM_WINDOW)  # the talker waits for credit long before the end
        assert failed.value.stage == "b"
        await settled(pipeline)
        assert (await pipeline.submit("next", 3))["chunk_ids"] == [0, 1, 2]  # under the failing chunk


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_a_slow_caller_does_not_make_the_producer_process_grow() -> None:
    config = endless_config(chunk_bytes=64 * 1024)
    config.stages[0].process = "p_talker"
    async with open_pipeline(config) as pipeline:
        pid = (await pipeline.health())["stages"]["talker"]["pid"]
        async with pipeline.stream("slow", "x") as stream:
            await stream.__anext__()
            await trio.sleep(0.5)  # the producer runs ahead until flow control stops it
            baseline = _rss_kib(pid)
            for _ in range(40):
                await stream.__anext__()
                await trio.sleep(0.02)
            grown = _rss_kib(pid) - baseline
        # Unbounded, 0.8 s of an unthrottled producer would be gigabytes of 64 KiB chunks.
        assert grown < 50 * 1024, f"producer grew by {grown} KiB"
        assert os.path.exists(f"/proc/{pid}")
        await settled(pipeline)
