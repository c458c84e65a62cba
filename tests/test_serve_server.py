"""Starting, binding and stopping the server; the omnitrio client; many concurrent streams."""

from __future__ import annotations

import logging
import os
import signal
import socket
from functools import partial

import httpx
import pytest
import trio

from omnitrio.client import ApiResponseError, OmnitrioClient
from omnitrio.serve import BindError, serve
from tests.fake_pipeline import FakePipeline, Served, start_server

SLOW_STREAM = {"messages": [{"role": "user", "content": "slow"}], "stream": True}


async def test_a_busy_port_is_an_error_naming_the_address() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BindError, match=f"127.0.0.1:{port}.*in use"):
            await serve(FakePipeline(), port=port, handle_signals=False)


async def test_sigterm_drains_then_cancels_in_flight_requests() -> None:
    fake = FakePipeline()
    stopped = trio.Event()

    async def run(task_status: trio.TaskStatus[int]) -> None:
        await serve(fake, port=0, graceful_timeout=0.2, task_status=task_status)
        stopped.set()

    async def cut_off_stream(client: httpx.AsyncClient) -> None:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post("/v1/chat/completions", json=SLOW_STREAM)

    async with trio.open_nursery() as nursery:
        port = await nursery.start(run)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            nursery.start_soon(cut_off_stream, client)
            request = await fake.arrivals.receive()
            os.kill(os.getpid(), signal.SIGTERM)
            with trio.fail_after(3):
                await stopped.wait()
                await request.exited.wait()
    assert request.outcome == "aborted"
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", port)


async def test_shutdown_event_lets_finished_requests_complete_and_returns() -> None:
    fake = FakePipeline()
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(partial(serve, fake, port=0, shutdown=shutdown, handle_signals=False))
        async with OmnitrioClient(f"http://127.0.0.1:{port}") as client:
            answer = await client.chat([{"role": "user", "content": "bye"}])
        shutdown.set()
    assert answer["choices"][0]["message"]["content"] == "echo: bye "


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    return await start_server(nursery)


async def test_client_covers_health_models_chat_speech_and_transcription(served: Served) -> None:
    async with OmnitrioClient(served.url) as client:
        health = await client.health()
        models = await client.models()
        chunks = [c async for c in client.chat_stream([{"role": "user", "content": "hey"}])]
        wav = await client.speech("hey")
        text = await client.transcribe(wav)
    assert health["stages"]["fake"]["alive"]
    assert models[0] == "fake-omni"  # then the OpenAI names it answers to
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "echo: hey "
    assert text["text"] == "heard 0.20 seconds "  # two words of speech, 0.1 s each


async def test_client_raises_with_the_openai_error_fields(served: Served) -> None:
    async with OmnitrioClient(served.url) as client:
        with pytest.raises(ApiResponseError) as caught:
            await client.chat([{"role": "user", "content": "overload"}])
    assert (caught.value.status, caught.value.error["code"]) == (429, "overloaded")


@pytest.mark.slow
async def test_200_concurrent_sse_clients_all_complete(served: Served) -> None:
    results: list[str] = []

    async def one(client: httpx.AsyncClient, i: int) -> None:
        body = {"messages": [{"role": "user", "content": f"client {i}"}], "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
        results.append(lines[-1])

    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=served.url, limits=limits, timeout=60) as client:
        async with trio.open_nursery() as nursery:
            for i in range(200):
                nursery.start_soon(one, client, i)
    assert results == ["data: [DONE]"] * 200
    assert served.fake.live == {}


async def test_the_running_on_line_is_logged_once_through_the_callers_logging(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    with caplog.at_level(logging.INFO):
        served = await start_server(nursery)
        async with httpx.AsyncClient(base_url=served.url) as client:
            assert (await client.get("/health")).status_code == 200
    running = [record for record in caplog.records if "Running on" in record.getMessage()]
    assert len(running) == 1
    assert "Running on" not in capsys.readouterr().err  # hypercorn printed nothing on a handler of its own
