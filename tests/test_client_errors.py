"""A scheduler's ``InvalidRequest`` reaches the caller as ``BadRequest`` from any process, and counts as
the caller's mistake, not a stage failure; ``/metrics`` counts what users asked, once each."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
import trio

from omnitrio import PipelineConfig, StageConfig, StagePayload, open_pipeline
from omnitrio.client import open_realtime
from omnitrio.contract import InvalidRequest
from omnitrio.errors import BadRequest
from schedulers.simple import SimpleScheduler
from tests.fake_pipeline import Served, start_server


def refuse(payload: StagePayload) -> StagePayload:
    if payload.data["raw_inputs"] == "too long":
        raise InvalidRequest(
            "the request is 2000 tokens; the context is 1024", code="context_length_exceeded", param="messages"
        )
    return payload


def create_refuser() -> SimpleScheduler:
    return SimpleScheduler(refuse)


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the Prometheus exposition ``text`` (0 when absent)."""
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    match = re.search(rf"^{name}{{{wanted}}} (\S+)$" if labels else rf"^{name} (\S+)$", text, re.M)
    return float(match[1]) if match else 0.0


@pytest.mark.parametrize("process", [False, True], ids=["inline", "in a process"])
async def test_invalid_request_reaches_the_caller_as_bad_request_naming_code_and_param(process: bool) -> None:
    stage = StageConfig(
        name="judge", factory_path=f"{__name__}.create_refuser", terminal=True, process="p1" if process else None
    )
    async with open_pipeline(PipelineConfig(name="refusing", stages=[stage]), inline=not process) as pipeline:
        with pytest.raises(BadRequest) as refused:
            await pipeline.submit("r1", "too long")
        assert await pipeline.submit("r2", "fine") == {"raw_inputs": "fine"}
        exposition = (await _scrape(pipeline)).decode()
    error = refused.value
    assert (error.stage, error.code, error.param) == ("judge", "context_length_exceeded", "messages")
    assert str(error) == "the request is 2000 tokens; the context is 1024"
    assert metric(exposition, "omnitrio_client_errors_total", stage="judge", code="context_length_exceeded") == 1
    assert metric(exposition, "omnitrio_requests_total", outcome="invalid") == 1
    assert metric(exposition, "omnitrio_requests_total", outcome="failed") == 0
    assert "omnitrio_stage_failures_total{" not in exposition


async def _scrape(pipeline: Any) -> bytes:
    import prometheus_client

    await pipeline.refresh_stage_gauges()
    return prometheus_client.generate_latest(pipeline.metrics_registry)


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    return await start_server(nursery)


async def test_metrics_count_each_user_request_once_and_client_errors_apart(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        for text in ("hi", "there"):
            assert (
                await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": text}]})
            ).status_code == 200
        assert (await client.post("/v1/chat/completions", json={"messages": []})).status_code == 400
        assert (
            await client.post("/v1/audio/speech", json={"input": "hi", "response_format": "wav"})
        ).status_code == 200
        async with open_realtime(served.ws_url) as rt:
            await rt.receive()
            await rt.send({"type": "session.update", "session": {"turn_detection": None}})
            for _ in range(20):
                await rt.send({"type": "input_audio_buffer.append", "audio": "AAAA" * 100})
            await rt.send({"type": "response.create"})
            while (await rt.receive())["type"] != "response.done":
                pass
        text = (await client.get("/metrics")).text
    assert metric(text, "omnitrio_api_requests_total", kind="chat", outcome="ok") == 2
    assert metric(text, "omnitrio_api_requests_total", kind="chat", outcome="client_error") == 1
    assert metric(text, "omnitrio_api_requests_total", kind="speech", outcome="ok") == 1
    assert metric(text, "omnitrio_api_requests_total", kind="realtime_session", outcome="ok") == 1
    assert metric(text, "omnitrio_api_requests_total", kind="realtime_response", outcome="ok") == 1
    counted = re.findall(r"^omnitrio_api_requests_total\{[^}]*\} (\S+)$", text, re.M)
    assert sum(map(float, counted)) == 6  # the appends are no requests
