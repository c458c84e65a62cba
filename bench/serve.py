"""Serving overhead: SSE first byte over a direct pipeline call, 200 concurrent SSE clients,
and the realtime WebSocket frame round trip.

    python -m bench.serve [--requests 200] [--clients 200]

The pipeline (``bench/serve_pipeline.toml``: one stage streaming ten words) is measured
twice: called directly in this process, and served by ``python -m omnitrio serve`` in a
subprocess on a loopback port, with httpx (SSE) and trio-websocket (realtime) as clients
here — so client and server do not share one trio loop.  Prints the figures and writes
``bench/results/serve.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from omnitrio import open_pipeline
from omnitrio.client import open_realtime
from omnitrio.config_loading import load

RESULTS = Path(__file__).parent / "results"
CHAT = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "stream": True}


PIPELINE = Path(__file__).parent / "serve_pipeline.toml"
PORT = 18931


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 3)


async def first_chunk_direct(pipeline: Any, n: int) -> list[float]:
    times = []
    inputs = {"task": "chat", "messages": CHAT["messages"], "modalities": ["text"]}
    for i in range(n):
        started = time.perf_counter()
        async with pipeline.stream(f"d{i}", inputs) as stream:
            async for _ in stream:
                times.append(time.perf_counter() - started)
                break
    return times


async def first_chunk_sse(client: httpx.AsyncClient, n: int) -> list[float]:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        async with client.stream("POST", "/v1/chat/completions", json=CHAT) as response:
            async for line in response.aiter_lines():
                if line.startswith("data:") and '"content"' in line:
                    times.append(time.perf_counter() - started)
                    break
    return times


async def first_byte_raw(port: int, n: int) -> tuple[list[float], list[float]]:
    """Time to the response's first byte and to the first content event, with a bare socket client.

    httpx spends about a millisecond of its own per request; this is the server's share.
    """
    body = json.dumps(CHAT).encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body
    first_byte, first_content = [], []
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        for _ in range(n):
            started = time.perf_counter()
            await stream.send_all(request)
            seen = b""
            got_byte = False
            while b"[DONE]" not in seen:
                data = await stream.receive_some(65536)
                if not got_byte:
                    first_byte.append(time.perf_counter() - started)
                    got_byte = True
                if b'"content"' in data and len(first_content) < len(first_byte):
                    first_content.append(time.perf_counter() - started)
                seen += data
            while not seen.endswith(b"0\r\n\r\n"):  # the end of the chunked body
                seen += await stream.receive_some(65536)
    return first_byte, first_content


async def concurrent_sse(client: httpx.AsyncClient, clients: int) -> dict[str, Any]:
    errors: list[str] = []
    done = 0

    async def one() -> None:
        nonlocal done
        try:
            async with client.stream("POST", "/v1/chat/completions", json=CHAT) as response:
                if response.status_code != 200:
                    errors.append(f"status {response.status_code}")
                    return
                lines = [line async for line in response.aiter_lines() if line.startswith("data:")]
                if lines[-1] != "data: [DONE]":
                    errors.append("stream did not end with [DONE]")
                    return
                done += 1
        except Exception as exc:
            errors.append(repr(exc))

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(one)
    return {
        "clients": clients,
        "completed": done,
        "errors": len(errors),
        "first_errors": errors[:5],
        "seconds": round(time.perf_counter() - started, 3),
    }


async def realtime_round_trips(url: str, n: int) -> list[float]:
    times = []
    async with open_realtime(url) as rt:
        await rt.receive()  # session.created
        await rt.send({"type": "session.update", "session": {"turn_detection": None}})
        while (await rt.receive())["type"] != "session.updated":
            pass
        for _ in range(n):
            started = time.perf_counter()
            await rt.send({"type": "session.update", "session": {}})
            while (await rt.receive())["type"] != "session.updated":
                pass
            times.append(time.perf_counter() - started)
    return times


async def main(requests: int, clients: int) -> dict[str, Any]:
    async with open_pipeline(load(PIPELINE), inline=True) as pipeline:
        await first_chunk_direct(pipeline, 20)
        direct = await first_chunk_direct(pipeline, requests)
    command = [sys.executable, "-m", "omnitrio", "serve", "--config", str(PIPELINE), "--port", str(PORT)]
    server = await trio.lowlevel.open_process(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{PORT}"
        limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
        async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
            with trio.fail_after(60):
                while True:
                    try:
                        if (await client.get("/health")).status_code == 200:
                            break
                    except httpx.TransportError:
                        await trio.sleep(0.1)
            await first_chunk_sse(client, 20)  # warm up
            sse = await first_chunk_sse(client, requests)
            raw_byte, raw_content = await first_byte_raw(PORT, requests)
            crowd = await concurrent_sse(client, clients)
        rtt = await realtime_round_trips(f"ws://127.0.0.1:{PORT}/v1/realtime", requests)
    finally:
        server.send_signal(signal.SIGINT)
        with trio.move_on_after(10):
            await server.wait()
        if server.returncode is None:
            server.kill()
    overhead = statistics.median(sse) - statistics.median(direct)
    return {
        "load_average": os.getloadavg(),
        "first_chunk_direct_ms": {"p50": pct(direct, 0.5), "p99": pct(direct, 0.99)},
        "first_chunk_sse_ms": {"p50": pct(sse, 0.5), "p99": pct(sse, 0.99)},
        "sse_first_content_overhead_ms_p50_httpx": round(overhead * 1e3, 3),
        "raw_client_first_byte_ms": {"p50": pct(raw_byte, 0.5), "p99": pct(raw_byte, 0.99)},
        "raw_client_first_content_ms": {"p50": pct(raw_content, 0.5), "p99": pct(raw_content, 0.99)},
        "sse_first_byte_overhead_ms_p50": round((statistics.median(raw_byte) - statistics.median(direct)) * 1e3, 3),
        "concurrent_sse": crowd,
        "realtime_frame_round_trip_ms": {"p50": pct(rtt, 0.5), "p99": pct(rtt, 0.99)},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--clients", type=int, default=200)
    args = parser.parse_args()
    out = trio.run(main, args.requests, args.clients)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "serve.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))
