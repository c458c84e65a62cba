"""The benchmark bodies, written once and run unchanged on omnitrio (trio) and on the peer (asyncio).

Each body takes a :class:`Runtime` adapter (how to open a pipeline, which config classes,
which concurrency primitives) and returns plain figures.  Request ids are never reused
within a run: the peer retires an aborted id for good.  Timings are printed and recorded,
never asserted.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from bench import pipelines
from bench.measure import MIB, latency_ms, loadavg, median_runs, percentile, shm_entries, vm_rss_mib


class Aio(Protocol):
    """The event loop's primitives (trio or asyncio)."""

    async def sleep(self, seconds: float) -> None: ...

    async def map_bounded(self, fn: Callable[[Any], Awaitable[None]], items: Iterable[Any], window: int) -> None:
        """Run ``fn(item)`` for every item with at most ``window`` running at once; return when all are done."""
        ...


class Api(Protocol):
    """One open pipeline, as the benchmarks use it."""

    async def submit(self, rid: str, inputs: Any) -> Any: ...

    def stream(self, rid: str, inputs: Any) -> AbstractAsyncContextManager[AsyncIterator[Any]]: ...

    def is_chunk(self, msg: Any) -> bool: ...

    async def abort(self, rid: str) -> bool:
        """omnitrio: ``abort(rid, wait=True)`` (every stage released); the peer: ``abort(rid)`` (no ack exists)."""
        ...

    async def stage_pids(self) -> dict[str, int]: ...


class Runtime(Protocol):
    """A runtime under test; attributes are read-only to the benchmarks."""

    @property
    def name(self) -> str: ...

    @property
    def process(self) -> bool:
        """True: one OS process per stage; False: every stage in the caller's process."""
        ...

    @property
    def classes(self) -> Any:
        """Holds ``PipelineConfig``, ``StageConfig``, ``FactoryArgs``, ``EndpointsConfig``."""
        ...

    @property
    def fanin_module(self) -> str: ...

    @property
    def batch_module(self) -> str: ...

    @property
    def aio(self) -> Aio: ...

    def open(self, config: Any) -> AbstractAsyncContextManager[tuple[Api, dict[str, float]]]:
        """Start ``config``; yields the API and a dict that holds ``start_s`` now and ``stop_s`` after exit."""
        ...


_ids = itertools.count()


def rid(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}"


def now() -> float:
    return time.perf_counter()


# ------------------------------------------------------------------ building blocks


async def c1_latency(api: Api, inputs: Any, n: int, warmup: int, prefix: str) -> dict[str, float]:
    """Sequential requests: p50/p99 of ``submit`` → result."""
    for _ in range(warmup):
        await api.submit(rid(prefix), inputs)
    samples = []
    for _ in range(n):
        t0 = now()
        await api.submit(rid(prefix), inputs)
        samples.append(now() - t0)
    return latency_ms(samples)


async def throughput(rt: Runtime, api: Api, inputs: Any, n: int, window: int, prefix: str) -> dict[str, float]:
    """``n`` requests with at most ``window`` in flight: req/s, latency under load, error count."""
    samples: list[float] = []
    errors = 0

    async def one(_: int) -> None:
        nonlocal errors
        t0 = now()
        try:
            await api.submit(rid(prefix), inputs)
        except Exception:
            errors += 1
            return
        samples.append(now() - t0)

    t0 = now()
    await rt.aio.map_bounded(one, range(n), window)
    wall = now() - t0
    lat = latency_ms(samples)
    return {"req_per_s": n / wall, "loaded_p50_ms": lat["p50_ms"], "loaded_p99_ms": lat["p99_ms"], "errors": errors}


async def one_stream(api: Api, prefix: str) -> tuple[float, float, int]:
    """(first-chunk latency from the ``stream()`` call, whole request, chunks) for one request."""
    t0 = now()
    first = None
    chunks = 0
    async with api.stream(rid(prefix), "say something") as s:
        async for msg in s:
            if api.is_chunk(msg):
                chunks += 1
                if first is None:
                    first = now() - t0
    return (first if first is not None else float("nan")), now() - t0, chunks


async def stream_at(rt: Runtime, api: Api, n: int, concurrency: int, prefix: str) -> dict[str, float]:
    firsts: list[float] = []
    totals: list[float] = []
    counts: list[int] = []

    async def one(_: int) -> None:
        first, total, chunks = await one_stream(api, prefix)
        firsts.append(first)
        totals.append(total)
        counts.append(chunks)

    t0 = now()
    await rt.aio.map_bounded(one, range(n), concurrency)
    wall = now() - t0
    per_request = [c / t for c, t in zip(counts, totals, strict=True)]
    first = latency_ms(firsts)
    return {
        "chunks_per_s": sum(counts) / wall,
        "per_request_chunks_per_s_p50": percentile(per_request, 50),
        "first_chunk_p50_ms": first["p50_ms"],
        "first_chunk_p99_ms": first["p99_ms"],
        "request_p50_ms": latency_ms(totals)["p50_ms"],
        "chunks_per_request": min(counts) if counts else 0,
        "requests": n,
    }


async def rss_snapshot(api: Api) -> dict[str, float | None]:
    import os

    pids = {"parent": os.getpid(), **await api.stage_pids()}
    return {name: vm_rss_mib(pid) for name, pid in pids.items()}


# ------------------------------------------------------------------ benchmarks


async def hop_latency(rt: Runtime, quick: bool) -> dict[str, Any]:
    """c=1 latency through 1 and 4 identity stages, and each open's start-up and shutdown time.

    Per extra hop = (4-stage p50 − 1-stage p50) / 3.  Full runs open each chain 3 times
    (fresh processes) and report medians.
    """
    n, warmup = (200, 30) if quick else (1000, 100)
    out: dict[str, Any] = {}
    for stages in (1, 4):
        runs = []
        for _ in range(1 if quick else 3):
            async with rt.open(pipelines.chain(rt.classes, stages, process=rt.process)) as (api, times):
                figures = await c1_latency(api, "x", n, warmup, f"hop{stages}")
            runs.append({**figures, "start_s": times["start_s"], "stop_s": times["stop_s"]})
        out[f"chain{stages}"] = median_runs(runs)
    out["per_extra_hop_p50_ms"] = (out["chain4"]["p50_ms"] - out["chain1"]["p50_ms"]) / 3
    return out


async def fan(rt: Runtime, quick: bool, *, rss: bool) -> dict[str, Any]:
    """Seed experiment 1: c=1 latency, throughput at 256 in flight, and (process mode) RSS growth."""
    n_c1, n_tp, n_rss = (200, 1000, 2000) if quick else (500, 3000, 10000)
    out: dict[str, Any] = {}
    async with rt.open(pipelines.fan(rt.classes, rt.fanin_module, process=rt.process)) as (api, times):
        result = await api.submit(rid("fan"), "hello omni world")
        if result.get("upper") != "HELLO OMNI WORLD" or result.get("count") != 3:
            raise RuntimeError(f"fan pipeline returned {result!r}")
        await throughput(rt, api, "hello omni world", 500, 256, "fanw")
        out["c1"] = await c1_latency(api, "hello omni world", n_c1, 50, "fan")
        runs = [await throughput(rt, api, "hello omni world", n_tp, 256, "fantp") for _ in range(1 if quick else 3)]
        out["tp256"] = median_runs(runs)
        if rss:
            before = await rss_snapshot(api)
            tp = await throughput(rt, api, "hello omni world", n_rss, 256, "fanrss")
            after = await rss_snapshot(api)
            scale = 10000 / n_rss
            growth = {
                k: (after[k] - before[k]) * scale  # type: ignore[operator]
                for k in before
                if before[k] is not None and after.get(k) is not None
            }
            stages = [v for k, v in growth.items() if k != "parent"]
            out["rss"] = {
                "requests": n_rss,
                "req_per_s": tp["req_per_s"],
                "errors": tp["errors"],
                "start_mib": before,
                "end_mib": after,
                "growth_mib_per_10k": growth,
                "max_stage_growth_mib_per_10k": max(stages) if stages else None,
            }
    return {**out, **times}


async def streaming(rt: Runtime, quick: bool) -> dict[str, Any]:
    """talker → vocoder, 100 chunks per request: chunks/s and first-chunk latency at c=1 and c=16.

    c=16 starts with 16 requests at once; 480 requests (30 per stream) keep that ramp a small
    part of the sample (at 160, p50 moved by ±5 ms between identical runs).
    """
    n1, n16 = (10, 48) if quick else (90, 480)
    shm_before = shm_entries()
    async with rt.open(pipelines.talker_vocoder(rt.classes, process=rt.process)) as (api, times):
        for _ in range(3):
            await one_stream(api, "sw")
        c1 = await stream_at(rt, api, n1, 1, "s1")
        c16 = await stream_at(rt, api, n16, 16, "s16")
    return {"c1": c1, "c16": c16, "shm_left": len(shm_entries() - shm_before), **times}


async def tensor(rt: Runtime, quick: bool) -> dict[str, Any]:
    """Stage A's preallocated float32 tensor → stage B across one process boundary: GB/s = size / p50."""
    counts = {1: 10, 16: 5, 128: 3} if quick else {1: 30, 16: 10, 128: 5}
    out: dict[str, Any] = {}
    shm_before = shm_entries()
    async with rt.open(pipelines.tensor_pair(rt.classes, process=rt.process)) as (api, times):
        for mb, n in counts.items():
            await api.submit(rid("tw"), mb)
            samples = []
            for _ in range(n):
                t0 = now()
                result = await api.submit(rid("t"), mb)
                samples.append(now() - t0)
                if result["nbytes"] != mb * MIB:
                    raise RuntimeError(f"tensor sink saw {result['nbytes']} bytes, expected {mb * MIB}")
            lat = latency_ms(samples)
            out[f"{mb}MB"] = {**lat, "GB_per_s": mb * MIB / 1e9 / (lat["p50_ms"] / 1000)}
    out["shm_left"] = len(shm_entries() - shm_before)
    return {**out, **times}


BATCH_MODES = ((200, True), (200, False), (50, True), (50, False))


async def batching(rt: Runtime, quick: bool) -> dict[str, Any]:
    """Seed experiment 2's encoder: a lone request's latency per window and idle mode; one burst of 4."""
    out: dict[str, Any] = {}
    for wait_ms, when_idle in BATCH_MODES:
        n = (5 if wait_ms >= 200 else 10) if quick else (20 if wait_ms >= 200 else 50)
        config = pipelines.batching(
            rt.classes, rt.batch_module, process=rt.process, wait_ms=wait_ms, when_idle=when_idle
        )
        async with rt.open(config) as (api, _):
            sizes: list[int] = []

            async def one(i: int, sizes: list[int] = sizes, api: Api = api) -> None:
                sizes.append((await api.submit(rid("burst"), i))["batch_size"])

            await api.submit(rid("bw"), 0)
            await rt.aio.map_bounded(one, range(4), 4)
            lone = []
            for _ in range(n):
                await rt.aio.sleep(0.02)
                t0 = now()
                await api.submit(rid("lone"), 0)
                lone.append(now() - t0)
        out[f"wait{wait_ms}_idle{when_idle}"] = {**latency_ms(lone), "burst_sizes": sorted(sizes)}
    return out


async def abort(rt: Runtime, quick: bool) -> dict[str, Any]:
    """Abort mid-stream (after chunk 20 of 200, 5 ms per step): time for the abort call to return."""
    trials = 5 if quick else 15
    samples = []
    async with rt.open(pipelines.talker_vocoder(rt.classes, process=rt.process, slow=True)) as (api, times):
        await api.submit(rid("aw"), "warm")
        for _ in range(trials):
            r = rid("ab")
            chunks = 0
            async with api.stream(r, "say something") as s:
                async for msg in s:
                    if api.is_chunk(msg):
                        chunks += 1
                        if chunks == 20:
                            t0 = now()
                            await api.abort(r)
                            samples.append(now() - t0)
                            break
        probe_t0 = now()
        await api.submit(rid("probe"), "after aborts")
        probe = now() - probe_t0
    return {**latency_ms(samples), "next_request_s": probe, **times}


def stamp(result: dict[str, Any], t0: float) -> dict[str, Any]:
    """Add the load average and wall time to a result (the machine is shared with other work)."""
    return {**result, "loadavg": loadavg(), "wall_s": round(now() - t0, 2)}


async def run_suite(
    rt: Runtime,
    quick: bool,
    progress: Any,
    only: set[str] | None = None,
    budget_s: float | None = None,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every benchmark that makes sense for ``rt``; a failing one records its error and the rest go on.

    With ``budget_s``, benchmarks not yet started once the suite has run that long are
    recorded as skipped (``--quick`` must finish on a loaded 2-core machine).  ``on_result``
    sees the results so far after each benchmark (the peer driver saves them, so a run
    stopped at its deadline keeps what it measured).
    """
    plan: list[tuple[str, Callable[[], Awaitable[dict[str, Any]]]]] = [
        ("hop_latency", lambda: hop_latency(rt, quick)),
        ("fan", lambda: fan(rt, quick, rss=rt.process)),
        ("streaming", lambda: streaming(rt, quick)),
        ("abort", lambda: abort(rt, quick)),
        ("batching", lambda: batching(rt, quick)),
    ]
    if rt.process:
        plan.append(("tensor", lambda: tensor(rt, quick)))
    results: dict[str, Any] = {}
    for name, body in plan:
        if only and name not in only:
            continue
        if budget_s is not None and progress.elapsed() > budget_s:
            results[name] = {"skipped": f"over the {budget_s:.0f} s time budget", "loadavg": loadavg()}
            if on_result is not None:
                on_result(results)
            continue
        label = f"{name} [{rt.name}]"
        t0 = progress.start(label)
        try:
            results[name] = stamp(await body(), t0)
            progress.done(label, t0)
        except Exception as exc:
            results[name] = stamp({"error": f"{type(exc).__name__}: {exc}"}, t0)
            progress.done(label, t0, f"FAILED: {type(exc).__name__}: {exc}")
        if on_result is not None:
            on_result(results)
    return results
