"""Nothing waits forever unnoticed: the server's default deadline, reported as a timeout error,
and requests held past their deadline in ``health()`` and ``/metrics``."""

from __future__ import annotations

import subprocess
import sys
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import prometheus_client
import pytest
import trio
import trio_websocket

from omnitrio import PipelineConfig, StageConfig, open_pipeline
from omnitrio.cli import build_parser, request_timeout
from omnitrio.serve import serve
from omnitrio.serve.context import DEFAULT_REQUEST_TIMEOUT_S
from tests.fake_pipeline import FakePipeline, start_server
from tests.pipelines import settled
from tests.test_cli import one_stage_toml
from toys.hand_scheduler import HandScheduler

ROOT = Path(__file__).resolve().parent.parent


class Silent(HandScheduler):
    """A scheduler that takes every request and never answers (the shape of a hung stage)."""


def create_silent() -> Silent:
    return Silent()


def silent_config(*, process: bool = False) -> PipelineConfig:
    stage = StageConfig(
        name="silent", factory_path=f"{__name__}.create_silent", terminal=True, process="p_silent" if process else None
    )
    return PipelineConfig(name="silent", stages=[stage])


@asynccontextmanager
async def serving(pipeline: Any, **options: Any) -> Any:
    """Serve ``pipeline`` on a free port; yields the base URL; stops the server before the pipeline."""
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        run = partial(serve, pipeline, port=0, handle_signals=False, shutdown=shutdown, graceful_timeout=0.5, **options)
        port = await nursery.start(run)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            shutdown.set()


def chat(url: str, *, stream: bool) -> Any:
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        answer = client.chat.completions.create(
            model="silent", messages=[{"role": "user", "content": "hello?"}], stream=stream
        )
        return list(answer) if stream else answer


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_request_that_never_finishes_is_a_timeout_error_in_the_openai_shape(stream: bool) -> None:
    """A 504 before any byte of the answer; an ``error`` event on an SSE stream already started."""
    async with open_pipeline(silent_config(), inline=True) as pipeline, serving(pipeline, request_timeout=0.5) as url:
        with trio.fail_after(30), pytest.raises(openai.APIError) as caught:
            await trio.to_thread.run_sync(partial(chat, url, stream=stream))
        if not stream:
            assert isinstance(caught.value, openai.InternalServerError)
            assert caught.value.status_code == 504
        body = cast(dict[str, Any], caught.value.body)
        assert (body["type"], body["code"]) == ("server_error", "timeout")
        assert "0.5" in body["message"]
        health = await settled(pipeline)  # the timed-out request was released everywhere
    assert health["overdue_requests"] == 0


class RecordingFake(FakePipeline):
    """The fake pipeline, remembering the deadline of every request the server made."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []

    def stream(self, request_id: str, inputs: Any, *, params: Any = None, timeout: float | None = None) -> Any:
        self.timeouts.append(timeout)
        return super().stream(request_id, inputs, params=params, timeout=timeout)


async def test_every_served_request_has_the_default_deadline(nursery: trio.Nursery) -> None:
    fake = RecordingFake()
    served = await start_server(nursery, fake)
    async with httpx.AsyncClient(base_url=served.url) as client:
        answer = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        speech = await client.post("/v1/audio/speech", json={"model": "fake-omni", "input": "hi", "voice": "alloy"})
    assert (answer.status_code, speech.status_code) == (200, 200)
    assert fake.timeouts == [DEFAULT_REQUEST_TIMEOUT_S, DEFAULT_REQUEST_TIMEOUT_S]


async def test_a_realtime_session_outlives_the_deadline_of_each_response(nursery: trio.Nursery) -> None:
    fake = RecordingFake()
    served = await start_server(nursery, fake, request_timeout=0.3)
    async with trio_websocket.open_websocket_url(served.ws_url) as ws:
        assert '"session.created"' in await ws.get_message()
        await trio.sleep(0.6)  # twice the deadline: the socket is not a request
        for _ in range(2):
            await ws.send_message('{"type": "response.create"}')
            with trio.fail_after(10):
                while '"response.done"' not in (event := await ws.get_message()):
                    continue
            assert '"completed"' in event
    assert fake.timeouts and set(fake.timeouts) == {0.3}


@pytest.mark.parametrize("process", [False, True], ids=["inline", "processes"])
async def test_health_and_metrics_show_requests_held_past_their_deadline(process: bool) -> None:
    async with open_pipeline(silent_config(process=process), inline=not process) as pipeline:
        assert (await pipeline.health())["overdue_requests"] == 0
        async with pipeline.stream("forgotten", "x", timeout=0.2), pipeline.stream("young", "y", timeout=60):
            await trio.sleep(0.4)  # nobody iterates "forgotten", so nothing enforces its deadline
            health = await pipeline.health()
            scrape = prometheus_client.generate_latest(pipeline.metrics_registry).decode()
        assert (health["requests"], health["overdue_requests"]) == (2, 1)
        assert health["oldest_request_age_s"] >= 0.4
        assert "omnitrio_requests_overdue 1.0" in scrape
        oldest = next(line for line in scrape.splitlines() if line.startswith("omnitrio_oldest_request_age_seconds "))
        assert float(oldest.split()[1]) >= 0.4
        health = await settled(pipeline)
        scrape = prometheus_client.generate_latest(pipeline.metrics_registry).decode()
    assert (health["overdue_requests"], health["oldest_request_age_s"]) == (0, None)
    assert "omnitrio_requests_overdue 0.0" in scrape


def test_request_timeout_comes_from_the_flag_then_the_config_then_the_server() -> None:
    configured = silent_config()
    configured.default_timeout = 7.0
    assert request_timeout(2.5, configured, DEFAULT_REQUEST_TIMEOUT_S) == 2.5
    assert request_timeout(0, configured, DEFAULT_REQUEST_TIMEOUT_S) is None
    assert request_timeout(None, configured, DEFAULT_REQUEST_TIMEOUT_S) == 7.0
    assert request_timeout(None, silent_config(), DEFAULT_REQUEST_TIMEOUT_S) == DEFAULT_REQUEST_TIMEOUT_S


@pytest.mark.parametrize("bad", ["-1", "soon", "inf", "nan"])
def test_a_bad_request_timeout_flag_is_a_usage_error_naming_it(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--request-timeout", bad])
    assert exited.value.code == 2
    assert "--request-timeout" in capsys.readouterr().err


TOML = one_stage_toml("silent", f"{__name__}.create_silent")


def test_serve_request_timeout_flag_answers_a_hung_request_with_504(tmp_path: Path) -> None:
    config = tmp_path / "silent.toml"
    config.write_text(TOML)
    command = [sys.executable, "-m", "omnitrio", "serve", "--config", str(config), "--port", "0"]
    server = subprocess.Popen(
        [*command, "--request-timeout", "0.5"], cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    try:
        assert server.stderr is not None
        for line in server.stderr:
            if " on http://" in line:
                url = line.split(" on ", 1)[1].split()[0]
                break
        else:
            raise AssertionError(f"the server never said where it serves (exit {server.wait()})")
        response = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert response.status_code == 504
        assert response.json()["error"]["code"] == "timeout"
    finally:
        server.terminate()
        server.wait(timeout=30)
