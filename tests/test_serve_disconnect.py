"""A client that goes away aborts its request in the pipeline, streamed or not."""

from __future__ import annotations

import json

import pytest
import trio

from tests.fake_pipeline import Served, start_server

ABORT_WITHIN = 0.1  # seconds from the client closing its socket to the pipeline stream being left


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    return await start_server(nursery)


async def open_request(served: Served, body: dict[str, object]) -> trio.SocketStream:
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\n\r\n"
    ).encode()
    stream = await trio.open_tcp_stream("127.0.0.1", served.port)
    await stream.send_all(head + payload)
    return stream


async def test_leaving_an_sse_stream_aborts_the_request(served: Served) -> None:
    body = {"messages": [{"role": "user", "content": "slow"}], "stream": True}
    stream = await open_request(served, body)
    received = b""
    with trio.fail_after(5):
        while b"data: " not in received:
            received += await stream.receive_some()
    request = served.fake.history[0]
    await stream.aclose()
    closed_at = trio.current_time()
    with trio.fail_after(2):
        await request.exited.wait()
    assert request.outcome == "aborted"
    assert request.exited_at is not None
    assert request.exited_at - closed_at < ABORT_WITHIN


async def test_leaving_a_whole_response_request_aborts_it(served: Served) -> None:
    stream = await open_request(served, {"messages": [{"role": "user", "content": "slow"}]})
    request = await served.fake.arrivals.receive()
    await stream.aclose()
    with trio.fail_after(2):
        await request.exited.wait()
    assert request.outcome == "aborted"
