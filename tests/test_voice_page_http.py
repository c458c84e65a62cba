"""The voice page's server side, without a browser: the page's files, same-origin WebSockets,
ephemeral keys (``/v1/realtime/client_secrets``) and the WebRTC offer/answer of ``/v1/realtime/calls``
(answered for an aiortc peer in this process). The page itself is driven in a real browser in
``test_voice_page.py``.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import httpx
import pytest
import trio
import trio_websocket

from omnitrio.serve.routes.client_secrets import ClientSecrets
from tests.fake_pipeline import Served, start_server

KEY = "sk-page-test"


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    return await start_server(nursery)


@pytest.fixture
async def keyed(nursery: trio.Nursery) -> Served:
    return await start_server(nursery, api_keys=[KEY])


async def test_the_voice_page_is_served_at_the_root_with_its_files(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        page = await client.get("/")
        script = await client.get("/static/voice.js")
        worklet = await client.get("/static/capture-worklet.js")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'id="talk"' in page.text and 'aria-live="polite"' in page.text
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert "registerProcessor" in worklet.text


async def test_the_page_learns_whether_to_ask_for_a_key_and_to_use_webrtc(served: Served, keyed: Served) -> None:
    async with httpx.AsyncClient() as client:
        open_config = (await client.get(f"{served.url}/voice.json")).json()
        keyed_config = (await client.get(f"{keyed.url}/voice.json")).json()  # no key needed for the page
    assert open_config["api_key"] is False and keyed_config["api_key"] is True
    assert open_config["webrtc"] is True and "default" in open_config["voices"]


async def test_a_page_the_server_serves_may_open_the_realtime_websocket(served: Served) -> None:
    origin = [("Origin", served.url)]
    async with trio_websocket.open_websocket_url(served.ws_url, extra_headers=origin) as ws:
        assert json.loads(await ws.get_message())["type"] == "session.created"


async def test_a_page_from_another_origin_is_still_refused(served: Served) -> None:
    origin = [("Origin", "http://127.0.0.1:1")]
    with pytest.raises(trio_websocket.ConnectionRejected) as refused:
        async with trio_websocket.open_websocket_url(served.ws_url, extra_headers=origin):
            pass
    assert refused.value.status_code == 403


async def mint(served: Served, body: dict[str, Any] | None = None, key: str = KEY) -> httpx.Response:
    async with httpx.AsyncClient(base_url=served.url) as client:
        headers = {"Authorization": f"Bearer {key}"}
        return await client.post("/v1/realtime/client_secrets", json=body or {}, headers=headers)


async def test_a_client_secret_is_an_ephemeral_key_in_openais_shape(keyed: Served) -> None:
    answer = await mint(keyed, {"session": {"type": "realtime", "instructions": "be brief"}})
    body = answer.json()
    assert answer.status_code == 200
    assert body["value"].startswith("ek_") and KEY not in body["value"]
    assert isinstance(body["expires_at"], int) and 590 <= body["expires_at"] - time.time() <= 600
    assert body["session"]["instructions"] == "be brief" and body["session"]["type"] == "realtime"


async def test_minting_a_client_secret_needs_the_real_key(keyed: Served) -> None:
    assert (await mint(keyed, key="wrong")).status_code == 401


async def test_a_client_secret_with_a_bad_session_field_is_a_400_naming_it(keyed: Served) -> None:
    answer = await mint(keyed, {"session": {"audio": {"output": {"speed": 9}}}})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "session.audio.output.speed"


async def test_an_ephemeral_key_opens_one_realtime_session_only(keyed: Served) -> None:
    value = (await mint(keyed)).json()["value"]
    protocols = ["realtime", f"openai-insecure-api-key.{value}"]
    async with trio_websocket.open_websocket_url(keyed.ws_url, subprotocols=protocols) as ws:
        assert json.loads(await ws.get_message())["type"] == "session.created"
    with pytest.raises(trio_websocket.ConnectionRejected) as refused:
        async with trio_websocket.open_websocket_url(keyed.ws_url, subprotocols=protocols):
            pass
    assert refused.value.status_code == 401


async def test_an_ephemeral_key_is_no_key_for_the_other_routes(keyed: Served) -> None:
    value = (await mint(keyed)).json()["value"]
    async with httpx.AsyncClient(base_url=keyed.url) as client:
        answer = await client.get("/v1/models", headers={"Authorization": f"Bearer {value}"})
    assert answer.status_code == 401


def test_an_expired_client_secret_admits_nothing() -> None:
    now = [1000.0]
    secrets = ClientSecrets(clock=lambda: now[0])
    value, expires_at = secrets.mint({}, 10)
    now[0] = expires_at + 1
    assert secrets.redeem(value) is None


async def test_a_call_offer_must_be_sdp(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        as_json = await client.post("/v1/realtime/calls", json={"sdp": "v=0"})
        not_sdp = await client.post("/v1/realtime/calls", content=b"hello", headers={"Content-Type": "application/sdp"})
    assert as_json.status_code == 415
    assert (not_sdp.status_code, not_sdp.json()["error"]["param"]) == (400, "sdp")


async def aiortc_offer() -> tuple[Any, str]:
    """An offer from an aiortc peer (audio sendrecv, the ``oai-events`` channel), made on its own loop."""
    from aiortc import RTCPeerConnection

    pc = RTCPeerConnection()
    pc.addTransceiver("audio", "sendrecv")
    pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


async def call(served: Served, **body: Any) -> httpx.Response:
    """POST an aiortc peer's offer to ``/v1/realtime/calls`` (``body``: httpx's content/files arguments
    around the offer, ``OFFER`` standing for it); the peer is closed again once answered."""
    loop = asyncio.new_event_loop()
    pc, offer = await trio.to_thread.run_sync(loop.run_until_complete, aiortc_offer())
    try:
        async with httpx.AsyncClient(base_url=served.url) as client:
            if "files" in body:
                files = {name: (None, offer if value == "OFFER" else value) for name, value in body["files"].items()}
                return await client.post("/v1/realtime/calls", files=files)
            return await client.post("/v1/realtime/calls", content=offer, headers={"Content-Type": "application/sdp"})
    finally:
        await trio.to_thread.run_sync(loop.run_until_complete, pc.close())
        loop.close()


async def test_a_call_is_answered_201_with_sdp_and_its_location_with_candidates_on_loopback_only(
    served: Served,
) -> None:
    answer = await call(served)
    assert answer.status_code == 201 and answer.headers["content-type"].startswith("application/sdp")
    assert re.fullmatch(r"/v1/realtime/calls/rtc-[0-9a-f]+", answer.headers["location"])
    candidates = re.findall(r"a=candidate:\S+ \d+ udp \d+ (\S+) \d+ typ host", answer.text)
    assert candidates and set(candidates) == {"127.0.0.1"}


async def test_hanging_up_a_call_that_does_not_exist_is_a_404(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        answer = await client.post("/v1/realtime/calls/rtc-nothing/hangup")
    assert (answer.status_code, answer.json()["error"]["param"]) == (404, "call_id")


async def test_a_call_offer_may_come_as_multipart_with_its_session(served: Served) -> None:
    session = json.dumps({"type": "realtime", "instructions": "be brief"})
    answer = await call(served, files={"sdp": "OFFER", "session": session})
    assert answer.status_code == 201 and answer.text.startswith("v=0")


async def test_calls_past_the_session_limit_are_refused_429(nursery: trio.Nursery) -> None:
    from omnitrio.serve.limits import ServeLimits

    served = await start_server(nursery, limits=ServeLimits(max_realtime_sessions=1))
    first, second = await call(served), await call(served)
    assert first.status_code == 201
    assert (second.status_code, second.json()["error"]["code"]) == (429, "session_limit_reached")


async def webrtc_client(
    url: str, steps: list[dict[str, Any]], until: str, *, clear_on: str | None = None, key: str | None = None
) -> Any:
    """An aiortc peer's call to ``url``: sends ``steps`` once the events channel opens, collects the
    server's events up to ``until`` (and 1 s of what follows), and the loudest sample of its track.
    ``clear_on``: send ``output_audio_buffer.clear`` when that event arrives."""
    from aiortc import RTCPeerConnection, RTCSessionDescription
    from aiortc.mediastreams import AudioStreamTrack, MediaStreamError

    pc = RTCPeerConnection()
    pc.addTrack(AudioStreamTrack())  # a silent microphone
    channel = pc.createDataChannel("oai-events")
    events: list[dict[str, Any]] = []
    loudest = [0]
    done = asyncio.Event()

    async def listen(track: Any) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            loudest[0] = max(loudest[0], int(abs(frame.to_ndarray()).max()))

    pc.on("track", lambda track: asyncio.ensure_future(listen(track)))

    def on_message(text: str) -> None:
        events.append(json.loads(text))
        if events[-1]["type"] == clear_on:
            channel.send(json.dumps({"type": "output_audio_buffer.clear"}))
        if events[-1]["type"] == until:
            done.set()

    channel.on("message", on_message)
    channel.on("open", lambda: [channel.send(json.dumps(step)) for step in steps])
    await pc.setLocalDescription(await pc.createOffer())
    async with httpx.AsyncClient() as client:
        answer = await client.post(
            f"{url}/v1/realtime/calls",
            content=pc.localDescription.sdp,
            headers={"Content-Type": "application/sdp", **({"Authorization": f"Bearer {key}"} if key else {})},
        )
        answer.raise_for_status()
    await pc.setRemoteDescription(RTCSessionDescription(answer.text, "answer"))
    try:
        await asyncio.wait_for(done.wait(), 20)
        await asyncio.sleep(1)
    finally:
        await pc.close()
    return events, loudest[0]


TYPED_TURN = [
    {"type": "session.update", "session": {"turn_detection": None}},
    {
        "type": "conversation.item.create",
        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello there"}]},
    },
    {"type": "response.create"},
]


async def test_a_webrtc_call_holds_the_session_over_its_events_channel_and_plays_the_answer(served: Served) -> None:
    client = webrtc_client(served.url, TYPED_TURN, "output_audio_buffer.stopped")
    events, loudest = await trio.to_thread.run_sync(asyncio.run, client)
    types = [event["type"] for event in events]
    assert types[:2] == ["session.created", "conversation.created"]
    assert "response.output_audio.delta" not in types  # the audio went on the track
    assert types.index("output_audio_buffer.started") < types.index("output_audio_buffer.stopped")
    assert loudest > 1000  # the toy answer's tone was heard
    done = next(event for event in events if event["type"] == "response.done")
    assert done["response"]["status"] == "completed"


async def test_a_webrtc_client_that_clears_the_output_buffer_gets_the_answer_truncated_where_it_played(
    served: Served,
) -> None:
    long_turn = [dict(step) for step in TYPED_TURN]
    long_turn[1] = {
        "type": "conversation.item.create",
        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "word " * 40}]},
    }
    client = webrtc_client(served.url, long_turn, "conversation.item.truncated", clear_on="output_audio_buffer.started")
    events, _ = await trio.to_thread.run_sync(asyncio.run, client)
    types = [event["type"] for event in events]
    truncated = next(event for event in events if event["type"] == "conversation.item.truncated")
    assert types.index("output_audio_buffer.cleared") < types.index("conversation.item.truncated")
    assert 0 <= truncated["audio_end_ms"] < 4000  # 4 s of answer: cut at the start, not played through
    assert types.count("output_audio_buffer.started") == 1  # the cut answer does not play again


async def test_a_call_opened_with_an_ephemeral_key_starts_with_the_session_it_was_minted_for(keyed: Served) -> None:
    value = (await mint(keyed, {"session": {"type": "realtime", "instructions": "be brief"}})).json()["value"]
    client = webrtc_client(keyed.url, [], "session.updated", key=value)
    events, _ = await trio.to_thread.run_sync(asyncio.run, client)
    updated = next(event for event in events if event["type"] == "session.updated")
    assert updated["session"]["instructions"] == "be brief"
