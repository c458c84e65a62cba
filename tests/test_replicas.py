"""``replicas = N`` on a process group: N processes, each request bound to one of them for its whole life."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import attrs
import prometheus_client
import pytest
import trio
import trio.testing

from omnitrio import FactoryArgs, PipelineConfig, RequestFailed, open_pipeline
from omnitrio.errors import RequestError
from omnitrio.replicas import Replicas
from tests.pipelines import T, chain_config, settled, talk_config, until_alive
from tests.test_seed_experiments import FANIN_OUTPUT
from toys.seed import ch4_fanin


def replicated(config: PipelineConfig, **groups: int) -> PipelineConfig:
    """``config`` with ``replicas`` set per process group."""
    processes = {group: {**config.processes.get(group, {}), "replicas": n} for group, n in groups.items()}
    return attrs.evolve(config, processes={**config.processes, **processes})


def pid_chain() -> PipelineConfig:
    """s0 (two replicas) → s1; each stage adds its process id to the result."""
    config = chain_config(2, process=True, factory="create_pid")
    return replicated(config, p_s0=2)


def test_a_request_s_incarnation_names_one_replica_of_each_group() -> None:
    replicas = Replicas({"a": "g", "b": "h", "c": "main"}, {"g": 2, "h": 3})
    for serial in (1, 2, 50):
        for g in range(2):
            for h in range(3):
                inc = replicas.bind(serial, {"g": g, "h": h})
                assert (replicas.process_of("a", inc), replicas.process_of("b", inc)) == (f"g.{g}", f"h.{h}")
                assert replicas.process_of("c", inc) == "main"
    assert replicas.bind(2, {"g": 0, "h": 0}) > replicas.bind(1, {"g": 1, "h": 2})  # later lives compare later


async def test_requests_spread_over_the_replicas_and_health_shows_each() -> None:
    async with open_pipeline(pid_chain()) as pipeline:
        pids = [(await pipeline.submit(f"r{i}", {}))["pids"][0] for i in range(4)]
        assert pids[0] != pids[1] and pids[:2] == pids[2:]  # one at a time: taken in turn
        entry = (await pipeline.health())["stages"]["s0"]
        assert [r["process"] for r in entry["replicas"]] == ["p_s0.0", "p_s0.1"]
        assert {r["pid"] for r in entry["replicas"]} == set(pids)
        assert entry["alive"] and entry["process"] == "p_s0"
        await pipeline.refresh_stage_gauges()
        scrape = prometheus_client.generate_latest(pipeline.metrics_registry).decode()
        assert 'omnitrio_replica_active_requests{process="p_s0.1",stage="s0"} 0.0' in scrape


async def test_concurrent_requests_go_to_the_least_loaded_replica() -> None:
    config = pid_chain()
    config.stages[0].factory_path = f"{T}.create_slow"
    config.stages[0].factory = FactoryArgs(seconds=5.0)
    async with open_pipeline(config) as pipeline:
        results: list[Any] = []

        async def one(i: int) -> None:
            results.append(await pipeline.submit(f"r{i}", {}))

        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(one, i)
            held = [0, 0]
            while sum(held) < 6:  # until all have arrived (each stays 5 s)
                await trio.sleep(0.05)
                held = [r["active_requests"] for r in (await pipeline.health())["stages"]["s0"]["replicas"]]
        assert held == [3, 3] and len(results) == 6


def on_replicas(module: Any, monkeypatch: pytest.MonkeyPatch, **groups: int) -> None:
    make: Callable[..., PipelineConfig] = module.make_config
    monkeypatch.setattr(module, "make_config", lambda *a: replicated(make(*a), **groups))


async def test_fan_in_stays_right_with_replicated_branches(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    on_replicas(ch4_fanin, monkeypatch, p_upper=2, p_join=2)
    await ch4_fanin.main(inline=False)
    assert capsys.readouterr().out == FANIN_OUTPUT


async def test_a_stream_stays_on_one_replica() -> None:
    config = replicated(talk_config(process=True, count=8), p_talker=2, p_b=2)
    async with open_pipeline(config) as pipeline:
        results: dict[str, Any] = {}

        async def one(rid: str) -> None:
            async with pipeline.stream(rid, 8) as stream:
                async for _ in stream:
                    pass
            results[rid] = stream.result

        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(one, f"r{i}")
        for result in results.values():  # every chunk reached the replica that got the payload
            assert result["chunk_ids"] == list(range(8)) and result["done"] and "payload" in result["events"]
        assert len(results) == 6
        await settled(pipeline, timeout=30)


def slow_replicated_chain() -> PipelineConfig:
    """s0 → s1 (two replicas, each request takes 3 s there)."""
    config = replicated(chain_config(2, process=True), p_s1=2)
    config.stages[1].factory_path = f"{T}.create_slow"
    config.stages[1].factory = FactoryArgs(seconds=3.0)
    return config


async def kill_one_replica(config: PipelineConfig) -> None:
    """Four requests over s1's two replicas; kill replica 1: its two fail, the others and later ones succeed."""
    async with open_pipeline(config) as pipeline:
        victim = (await pipeline.health())["stages"]["s1"]["replicas"][1]["pid"]
        outcomes: dict[str, Any] = {}

        async def one(rid: str) -> None:
            try:
                outcomes[rid] = await pipeline.submit(rid, rid, timeout=120)
            except RequestError as exc:
                outcomes[rid] = exc

        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(one, f"r{i}")
            with trio.fail_after(60):  # until each replica of s1 holds two of them (3 s each)
                while [r["active_requests"] for r in (await pipeline.health())["stages"]["s1"]["replicas"]] != [2, 2]:
                    await trio.testing.wait_all_tasks_blocked(cushion=0.01)
            os.kill(victim, signal.SIGKILL)
        failed = {rid: exc for rid, exc in outcomes.items() if isinstance(exc, RequestError)}
        assert len(failed) == 2, outcomes
        assert all(isinstance(exc, RequestFailed) and exc.error_type == "ProcessDied" for exc in failed.values())
        assert all("process 'p_s1.1' (stages s1) died" in str(exc) for exc in failed.values())
        assert all(outcomes[rid] == {"raw_inputs": rid} for rid in outcomes.keys() - failed.keys())
        await until_alive(pipeline, "s1", timeout=120)
        replicas = (await pipeline.health())["stages"]["s1"]["replicas"]
        assert [r["restarts"] for r in replicas] == [0, 1] and replicas[1]["pid"] != victim
        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(one, f"after{i}")
        assert all(outcomes[f"after{i}"] == {"raw_inputs": f"after{i}"} for i in range(4))
        await settled(pipeline, timeout=60)


async def test_a_dead_replica_fails_only_its_own_requests_and_restarts() -> None:
    await kill_one_replica(slow_replicated_chain())
