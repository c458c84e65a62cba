"""What the stage's side of the scheduler contract promises: a bounded outbox stays bounded,
and a request a scheduler admits by itself reaches the caller."""

from __future__ import annotations

import queue
import threading

import pytest
import trio

from omnitrio import FactoryArgs, PipelineConfig, StageConfig, open_pipeline
from omnitrio.contract import OutgoingMessage, put_messages
from omnitrio.messages import CompleteMessage, StreamMessage
from tests import pd_stages
from tests.pipelines import settled

P = "tests.pd_stages"


def test_put_messages_never_fills_a_bounded_outbox_past_maxsize() -> None:
    outbox: queue.Queue[OutgoingMessage] = queue.Queue(maxsize=4)
    producer = threading.Thread(
        target=put_messages, args=(outbox, [OutgoingMessage("r", "stream", data=i) for i in range(10)])
    )
    producer.start()
    seen: list[int] = []
    taken: list[object] = []
    while len(taken) < 10:
        with outbox.not_empty:
            while not outbox.queue:
                outbox.not_empty.wait()
            seen.append(len(outbox.queue))
        taken.append(outbox.get_nowait().data)
    producer.join()
    assert max(seen) <= 4
    assert taken == list(range(10))


def pd_config(key: str) -> PipelineConfig:
    return PipelineConfig(
        stages=[
            StageConfig(
                name="prefill", factory_path=f"{P}.create_prefill", factory=FactoryArgs(key=key), next="decode"
            ),
            StageConfig(name="decode", factory_path=f"{P}.create_decode", factory=FactoryArgs(key=key), terminal=True),
        ]
    )


@pytest.mark.parametrize("process", [False, True])
async def test_a_request_the_decode_scheduler_admits_streams_and_completes_for_the_caller(
    process: bool, request: pytest.FixtureRequest
) -> None:
    config = pd_config(request.node.name)
    if process:
        for stage in config.stages:
            stage.process = "p_pd"  # the pair shares its channel: one process
    async with open_pipeline(config, inline=not process) as pipeline:
        with trio.fail_after(20):
            async with pipeline.stream("r1", "hello") as stream:
                received = [msg async for msg in stream]
        chunks = [m.chunk for m in received if isinstance(m, StreamMessage)]
        assert chunks == list(range(pd_stages.CHUNKS))
        assert isinstance(received[-1], CompleteMessage)
        assert received[-1].result == {"decoded": "hello"}
        await settled(pipeline)
