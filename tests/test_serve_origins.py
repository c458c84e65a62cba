"""Browsers: no CORS unless an origin is allowed; WebSocket handshakes from other origins are refused."""

from __future__ import annotations

import json

import httpx
import pytest
import trio
import trio_websocket

from tests.fake_pipeline import Served, start_server

APP = "https://app.example"
PREFLIGHT = {
    "Origin": APP,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
}


async def test_cors_is_off_by_default(nursery: trio.Nursery) -> None:
    served = await start_server(nursery)
    async with httpx.AsyncClient(base_url=served.url) as client:
        preflight = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        simple = await client.get("/v1/models", headers={"Origin": APP})
    assert "access-control-allow-origin" not in preflight.headers
    assert "access-control-allow-origin" not in simple.headers


@pytest.fixture
async def allowing(nursery: trio.Nursery) -> Served:
    return await start_server(nursery, allowed_origins=[APP], api_keys=["sk-k"])


async def test_an_allowed_origin_passes_preflight_and_reads_answers_errors_included(allowing: Served) -> None:
    async with httpx.AsyncClient(base_url=allowing.url) as client:
        preflight = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        answer = await client.get("/v1/models", headers={"Origin": APP, "Authorization": "Bearer sk-k"})
        refused = await client.get("/v1/models", headers={"Origin": APP})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == APP
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    assert answer.headers["access-control-allow-origin"] == APP
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == APP  # the page can read why


async def test_another_origin_gets_no_cors_headers(allowing: Served) -> None:
    async with httpx.AsyncClient(base_url=allowing.url) as client:
        preflight = await client.options(
            "/v1/chat/completions", headers={**PREFLIGHT, "Origin": "https://evil.example"}
        )
    assert "access-control-allow-origin" not in preflight.headers


async def test_a_websocket_from_a_page_of_another_origin_is_refused_with_403(nursery: trio.Nursery) -> None:
    served = await start_server(nursery, allowed_origins=[APP])
    with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
        async with trio_websocket.open_websocket_url(served.ws_url, extra_headers=[("Origin", "https://evil.example")]):
            pass
    async with trio_websocket.open_websocket_url(served.ws_url, extra_headers=[("Origin", APP)]) as ws:
        with trio.fail_after(5):
            created = json.loads(await ws.get_message())
    assert rejected.value.status_code == 403
    assert "evil.example" in json.loads(rejected.value.body or b"{}")["error"]["message"]
    assert created["type"] == "session.created"


async def test_by_default_a_websocket_from_any_browser_page_is_refused(nursery: trio.Nursery) -> None:
    served = await start_server(nursery)
    with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
        async with trio_websocket.open_websocket_url(
            served.ws_url, extra_headers=[("Origin", "http://localhost:3000")]
        ):
            pass
    assert rejected.value.status_code == 403


async def test_a_refused_websocket_origin_is_logged_once_with_the_setting_that_allows_it(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    served = await start_server(nursery, allowed_origins=[APP])
    for _ in range(2):  # a page's reconnect loop
        with pytest.raises(trio_websocket.ConnectionRejected):
            async with trio_websocket.open_websocket_url(served.ws_url, extra_headers=[("Origin", "http://page.test")]):
                pass
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "page.test" in r.getMessage()]
    assert len(warnings) == 1
    assert "'http://page.test'" in warnings[0] and "--allowed-origin http://page.test" in warnings[0]
