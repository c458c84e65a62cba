"""The soak workload: mixed requests and one kill -9 through pipelines with one process per stage.

:func:`soak` runs successes, compute failures, aborts at random points, deadlines, caller
cancellations and one kill -9 of a stage process, concurrently, then reports every stage's and the
coordinator's leftover per-request state, our leftover shared memory, and each process's RSS curve.
``bench/soak.py`` runs it long and writes the figures; ``tests/test_soak.py`` runs it short and
asserts that nothing is left behind.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import attrs
import trio

from omnitrio import (
    FactoryArgs,
    Overloaded,
    PipelineConfig,
    RequestAborted,
    RequestFailed,
    StageConfig,
    open_pipeline,
)

T = "toys.stages"
S = "toys.stream_stages"


def fan_pipeline() -> PipelineConfig:
    join = {"wait_for": ["upper", "count"], "merge_fn": f"{T}.merge_by_name"}
    return PipelineConfig(
        name="soak-fan",
        stages=[
            StageConfig(
                name="words",
                process="p_words",
                factory_path=f"{T}.create_words",
                next=["upper", "count"],
                project_payload={"upper": f"{T}.project_text", "count": f"{T}.project_words"},
            ),
            StageConfig(name="upper", process="p_upper", factory_path=f"{T}.create_echo", next="join"),
            StageConfig(name="count", process="p_count", factory_path=f"{T}.create_boom", next="join"),
            StageConfig(name="join", process="p_join", factory_path=f"{T}.create_echo", terminal=True, **join),
        ],
    )


def stream_pipeline() -> PipelineConfig:
    return PipelineConfig(
        name="soak-stream",
        stages=[
            StageConfig(
                name="talker",
                process="p_talker",
                factory_path=f"{S}.create_producer",
                factory=FactoryArgs(count=20),
                next="vocoder",
                stream_to=["vocoder"],
            ),
            StageConfig(
                name="vocoder",
                process="p_vocoder",
                factory_path=f"{S}.create_counter",
                terminal=True,
                can_accept_stream_before_payload=True,
            ),
        ],
    )


class SoakStalled(Exception):
    """Requests of the soak were still waiting at its deadline; the message says which, and
    which stages held requests then."""


@attrs.define
class SoakReport:
    pipeline: str
    requests: int
    seconds: float
    outcomes: dict[str, int]
    unexpected: list[str]
    leftover_requests: int
    leftover_stage_state: dict[str, int]
    leftover_shm: list[str]
    rss_growth_kib: dict[str, int]
    kill_to_failure_ms: float | None
    rss_curve_kib: list[dict[str, int]] = attrs.field(factory=list)
    """``{"requests": submitted so far, process: VmRSS KiB, ...}`` at even steps."""

    @property
    def clean(self) -> bool:
        return (
            not self.unexpected
            and self.leftover_requests == 0
            and not any(self.leftover_stage_state.values())
            and not self.leftover_shm
        )


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def _our_shm() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"omnitrio-{os.getpid()}-")}


async def soak(
    config: PipelineConfig,
    requests: int,
    concurrency: int,
    kill_stage: str,
    seed: int = 1,
    samples: int = 10,
    deadline: float | None = None,
) -> SoakReport:
    """Run the soak; raises :class:`SoakStalled` when its requests have not all finished
    ``deadline`` seconds after the first was sent (no limit with None)."""
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    unexpected: list[str] = []
    shm_before = _our_shm()
    kill_at = requests // 4
    rss_mark = requests // 2
    rss_first: dict[str, int] = {}
    curve: list[dict[str, int]] = []
    sample_every = max(requests // max(samples, 1), 1)
    kill_seen: list[float] = []
    killed_at: list[float] = []
    waiting: set[str] = set()
    stalled: list[str] = []
    streaming = any(s.stream_to for s in config.stages)
    started = time.perf_counter()
    async with open_pipeline(config) as pipeline:
        limiter = trio.Semaphore(concurrency)

        async def pids() -> dict[str, int]:
            health = await pipeline.health()
            found = {name: s["pid"] for name, s in health["stages"].items()}
            return {"parent": os.getpid(), **found}

        async def watchdog(guarded: trio.CancelScope) -> None:
            assert deadline is not None
            await trio.sleep(deadline)
            held = {name: s["active_requests"] for name, s in (await pipeline.health())["stages"].items()}
            stalled.append(
                f"not done after {deadline:g} s: {len(waiting)} requests still waiting (first: {sorted(waiting)[:8]}); "
                f"live at the coordinator: {pipeline.request_health()['requests']}; held per stage: {held}"
            )
            guarded.cancel()

        async def one(i: int) -> None:
            rid = f"q{i}"
            waiting.add(rid)
            kind = rng.choices(["ok", "fail", "abort", "deadline", "cancel"], [55, 15, 10, 10, 10])[0]
            text = f"boom {i}" if kind == "fail" and not streaming else f"hello {i}"
            try:
                async with trio.open_nursery() as nursery:
                    if kind == "abort":

                        async def aborter() -> None:
                            await trio.sleep(rng.random() * 0.005)
                            await pipeline.abort(rid)

                        nursery.start_soon(aborter)
                    timeout = rng.uniform(0.0005, 0.005) if kind == "deadline" else None
                    with trio.move_on_after(rng.random() * 0.005 if kind == "cancel" else 1e9):
                        if streaming:
                            async with pipeline.stream(rid, text, timeout=timeout) as stream:
                                async for _ in stream:
                                    pass
                        else:
                            await pipeline.submit(rid, text, timeout=timeout)
                    outcomes["completed"] += 1
            except* RequestFailed as group:
                for exc in group.exceptions:
                    assert isinstance(exc, RequestFailed)
                    if exc.error_type == "ProcessDown":
                        outcomes["refused_while_restarting"] += 1
                    elif exc.error_type == "ProcessDied":
                        outcomes["process_died"] += 1
                        if killed_at and not kill_seen:
                            kill_seen.append(time.perf_counter())
                    elif kind == "fail" and exc.error_type == "ValueError":
                        outcomes["failed"] += 1
                    else:
                        unexpected.append(f"{rid} ({kind}): {exc}")
            except* RequestAborted:
                outcomes["aborted_or_timed_out"] += 1
            except* Overloaded as group:
                unexpected.append(f"{rid}: {group.exceptions[0]}")
            finally:
                waiting.discard(rid)
                limiter.release()

        async with trio.open_nursery() as guard:
            if deadline is not None:
                guard.start_soon(watchdog, guard.cancel_scope)
            async with trio.open_nursery() as nursery:
                for i in range(requests):
                    await limiter.acquire()
                    if i == kill_at:
                        victim = (await pids())[kill_stage]
                        killed_at.append(time.perf_counter())
                        os.kill(victim, signal.SIGKILL)
                    if i == rss_mark:
                        with trio.fail_after(30):
                            while not all(s["alive"] for s in (await pipeline.health())["stages"].values()):
                                await trio.sleep(0.05)
                        rss_first = {name: _rss_kib(pid) for name, pid in (await pids()).items()}
                    if i % sample_every == 0:
                        curve.append({"requests": i} | {name: _rss_kib(pid) for name, pid in (await pids()).items()})
                    nursery.start_soon(one, i)
            guard.cancel_scope.cancel()
        if stalled:
            raise SoakStalled(stalled[0])
        with trio.fail_after(30):
            while True:
                health = await pipeline.health()
                if health["requests"] == 0 and not any(s["active_requests"] for s in health["stages"].values()):
                    break
                await trio.sleep(0.05)
        rss_last = {name: _rss_kib(pid) for name, pid in (await pids()).items()}
        curve.append({"requests": requests} | rss_last)
        stage_state = {name: s["active_requests"] for name, s in health["stages"].items()}
    growth = {name: rss_last.get(name, 0) - first for name, first in rss_first.items()}
    return SoakReport(
        pipeline=config.name or "",
        requests=requests,
        seconds=round(time.perf_counter() - started, 2),
        outcomes=dict(outcomes),
        unexpected=unexpected[:20],
        leftover_requests=health["requests"],
        leftover_stage_state=stage_state,
        leftover_shm=sorted(_our_shm() - shm_before),
        rss_growth_kib=growth,
        kill_to_failure_ms=round((kill_seen[0] - killed_at[0]) * 1e3, 2) if kill_seen and killed_at else None,
        rss_curve_kib=curve,
    )
