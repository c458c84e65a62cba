"""API keys: /v1/* needs one, the official openai client (HTTP and realtime) sends it unchanged."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio
import trio_websocket

from omnitrio.client import OmnitrioClient, open_realtime
from omnitrio.serve.auth import ApiKeys, keys_from
from omnitrio.serve.server import unguarded_warning
from tests.fake_pipeline import Served, start_server
from tests.test_cli import TOY, free_port, wait_for_health, write

KEY = "sk-test-0123456789"
ROUTES = [
    ("GET", "/v1/models"),
    ("GET", "/v1/models/fake-omni"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/audio/speech"),
    ("POST", "/v1/audio/transcriptions"),
    ("GET", "/v1/nothing"),
]


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    return await start_server(nursery, api_keys=[KEY, "sk-second"])


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize("authorization", [None, "Bearer sk-wrong", "Basic c2stdGVzdA==", "Bearer", f"bearer {KEY}x"])
async def test_v1_routes_refuse_a_missing_or_wrong_key_with_401(
    served: Served, method: str, path: str, authorization: str | None
) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    async with httpx.AsyncClient(base_url=served.url) as client:
        response = await client.request(method, path, headers=headers, json={"messages": []})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "invalid_api_key"
    assert "sk-" not in error["message"]  # the offered key is never echoed
    assert served.fake.history == []


async def test_health_stays_open_and_metrics_needs_the_key(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        health = await client.get("/health")
        metrics = await client.get("/metrics")
        metrics_with_key = await client.get("/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert health.status_code == 200
    assert metrics.status_code == 401
    assert metrics_with_key.status_code == 200


async def test_public_metrics_are_served_without_a_key(nursery: trio.Nursery) -> None:
    served = await start_server(nursery, api_keys=[KEY], public_metrics=True)
    async with httpx.AsyncClient(base_url=served.url) as client:
        assert (await client.get("/metrics")).status_code == 200
        assert (await client.get("/v1/models")).status_code == 401


async def test_every_configured_key_is_accepted(served: Served) -> None:
    for key in (KEY, "sk-second"):
        async with OmnitrioClient(served.url, api_key=key) as client:
            assert (await client.models())[0] == "fake-omni"


async def test_the_official_openai_client_works_with_its_api_key(served: Served) -> None:
    def chat(api_key: str) -> Any:
        with openai.OpenAI(base_url=f"{served.url}/v1", api_key=api_key, max_retries=0) as client:
            messages = [{"role": "user", "content": "hello"}]
            return client.chat.completions.create(model="fake-omni", messages=messages)  # type: ignore[arg-type]

    answer = await trio.to_thread.run_sync(chat, KEY)
    with pytest.raises(openai.AuthenticationError) as refused:
        await trio.to_thread.run_sync(chat, "sk-wrong")
    assert answer.choices[0].message.content == "echo: hello "
    assert refused.value.status_code == 401


async def test_realtime_accepts_the_key_in_the_authorization_header(served: Served) -> None:
    async with open_realtime(served.ws_url, api_key=KEY) as rt:
        with trio.fail_after(5):
            created = await rt.receive()
    assert created["type"] == "session.created"


async def test_realtime_accepts_the_browser_subprotocol_and_answers_realtime(served: Served) -> None:
    protocols = ["realtime", f"openai-insecure-api-key.{KEY}", "openai-beta.realtime-v1"]
    async with trio_websocket.open_websocket_url(served.ws_url, subprotocols=protocols) as ws:
        with trio.fail_after(5):
            created = json.loads(await ws.get_message())
        assert ws.subprotocol == "realtime"  # never the one carrying the key
    assert created["type"] == "session.created"


@pytest.mark.parametrize("protocols", [[], ["realtime", "openai-insecure-api-key.sk-wrong"]])
async def test_realtime_without_a_valid_key_is_refused_with_401_before_the_handshake(
    served: Served, protocols: list[str]
) -> None:
    with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
        async with trio_websocket.open_websocket_url(served.ws_url, subprotocols=protocols):
            pass
    assert rejected.value.status_code == 401
    assert json.loads(rejected.value.body or b"{}")["error"]["code"] == "invalid_api_key"
    assert served.fake.history == []


def _openai_realtime_first_event(base_url: str, api_key: str) -> str:
    with openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        with client.realtime.connect(model="fake-omni") as connection:
            return connection.recv().type


async def test_the_official_openai_realtime_client_connects_with_its_api_key(served: Served) -> None:
    pytest.importorskip("websockets", reason="openai[realtime] is not installed")
    from websockets.exceptions import InvalidStatus

    first = await trio.to_thread.run_sync(_openai_realtime_first_event, f"{served.url}/v1", KEY)
    with pytest.raises(InvalidStatus) as refused:
        await trio.to_thread.run_sync(_openai_realtime_first_event, f"{served.url}/v1", "sk-wrong")
    assert first == "session.created"
    assert refused.value.response.status_code == 401


async def test_without_keys_every_route_is_open(nursery: trio.Nursery) -> None:
    served = await start_server(nursery)
    async with OmnitrioClient(served.url) as client:
        assert (await client.models())[0] == "fake-omni"


def test_keys_come_from_flags_and_the_comma_separated_environment_variable() -> None:
    keys = keys_from(["sk-a"], {"OMNITRIO_API_KEY": " sk-b , sk-c,"})
    assert keys == ApiKeys(("sk-a", "sk-b", "sk-c"))
    assert not keys_from([], {})
    with pytest.raises(ValueError, match="whitespace"):
        ApiKeys(("sk a",))


def test_listening_beyond_loopback_without_a_key_is_warned_about() -> None:
    assert "anyone who can reach" in (unguarded_warning("0.0.0.0", ApiKeys()) or "")
    assert "anyone who can reach" in (unguarded_warning("192.168.1.20", ApiKeys()) or "")
    assert unguarded_warning("0.0.0.0", ApiKeys((KEY,))) is None
    assert unguarded_warning("127.0.0.1", ApiKeys()) is None
    assert unguarded_warning("::1", ApiKeys()) is None


async def test_serving_on_loopback_without_a_key_logs_no_warning(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="omnitrio.serve"):
        await start_server(nursery)
    assert not [r for r in caplog.records if "API key" in r.getMessage()]


def test_cli_serve_takes_keys_from_flags_and_the_environment(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = write(tmp_path, TOY)
    environ = {**os.environ, "OMNITRIO_API_KEY": "sk-env-1,sk-env-2"}
    args = ["serve", "--config", str(config), "--port", str(port), "--api-key", "sk-flag"]
    server = subprocess.Popen(
        [sys.executable, "-m", "omnitrio", *args, "--allowed-origin", "https://app.example"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environ,
    )
    try:
        wait_for_health(url, server)
        refused = httpx.get(f"{url}/v1/models")
        keys = ["sk-flag", "sk-env-1", "sk-env-2"]
        admitted = [httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}) for key in keys]
        cors = httpx.get(f"{url}/v1/models", headers={"Origin": "https://app.example"})
    finally:
        server.send_signal(signal.SIGINT)
        _, err = server.communicate(timeout=30)
    assert refused.status_code == 401
    assert [response.status_code for response in admitted] == [200, 200, 200]
    assert cors.headers["access-control-allow-origin"] == "https://app.example"
    assert server.returncode == 0, err
    assert "without an API key" not in err
