"""``placement = "ray"``: process groups as Ray actors on a loopback-only local cluster.

Runs only where the ``ray`` extra is installed.  One local cluster (2 CPUs) serves the
module, on one pytest worker (``--dist loadscope``); start-up under load takes many
seconds, so nothing here is timed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import pytest
import trio

from omnitrio import FactoryArgs, PipelineConfig, RequestFailed, open_pipeline
from omnitrio.placement.cluster import loopback_env, ray_cluster
from tests.pipelines import T, chain_config, settled, until_alive, until_held
from tests.test_replicas import kill_one_replica, slow_replicated_chain
from tests.test_seed_experiments import BATCH_OUTPUT, FANIN_OUTPUT, STREAM_OUTPUT
from toys.seed import ch4_batch, ch4_fanin, ch4_stream

loopback_env()
pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

LOOPBACK = ("127.0.0.1", "::ffff:127.0.0.1", "::1")


def descendants(root: int) -> set[int]:
    """Every live process below ``root`` (the cluster's processes are the driver's descendants)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def non_loopback_sockets(pids: set[int]) -> list[str]:
    """Lines of ``ss`` for TCP/UDP sockets of ``pids`` with an end that is not loopback."""
    out = subprocess.run(["ss", "-tuanpH"], capture_output=True, text=True, check=True).stdout
    bad = []
    for line in out.splitlines():
        owners = {int(p.split(",")[0]) for p in line.split("pid=")[1:]}
        if not owners & pids:
            continue
        local, peer = line.split()[4:6]
        ends = (local,) if peer.endswith(":*") else (local, peer)  # ":*": listening or not connected
        if any(end.rsplit(":", 1)[0].split("%")[0].strip("[]") not in LOOPBACK for end in ends):
            bad.append(line)
    return bad


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with ray_cluster(num_cpus=2) as ray:
        yield ray


def on_ray(module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``module.make_config`` place its process groups on Ray."""
    make: Callable[..., PipelineConfig] = module.make_config
    monkeypatch.setattr(module, "make_config", lambda *a: attrs.evolve(make(*a), placement="ray"))


def our_shm() -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"omnitrio-{os.getpid()}-")]


async def test_seed_fan_out_fan_in_on_ray(cluster: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    on_ray(ch4_fanin, monkeypatch)
    await ch4_fanin.main(inline=False)
    assert capsys.readouterr().out == FANIN_OUTPUT


async def test_seed_batching_window_on_ray(cluster: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    on_ray(ch4_batch, monkeypatch)
    await ch4_batch.main(inline=False)
    assert capsys.readouterr().out == BATCH_OUTPUT


async def test_seed_streaming_on_ray(cluster: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    on_ray(ch4_stream, monkeypatch)
    await ch4_stream.main(inline=False)
    assert capsys.readouterr().out == STREAM_OUTPUT


async def test_groups_run_in_actors_talking_tcp_on_loopback_only(cluster: Any) -> None:
    config = attrs.evolve(chain_config(3, process=True), placement="ray")
    async with open_pipeline(config) as pipeline:
        assert await pipeline.submit("r", "x") == {"raw_inputs": "x"}
        stages = (await pipeline.health())["stages"]
        pids = {stages[name]["pid"] for name in ("s0", "s1", "s2")}
        assert len(pids) == 3 and os.getpid() not in pids
        assert non_loopback_sockets(descendants(os.getpid()) | {os.getpid()}) == []
    assert our_shm() == []


async def test_a_killed_actor_fails_its_requests_and_is_restarted(cluster: Any) -> None:
    config = attrs.evolve(chain_config(2, process=True), placement="ray")
    config.stages[1].factory_path = f"{T}.create_slow"
    config.stages[1].factory = FactoryArgs(seconds=5.0)
    async with open_pipeline(config) as pipeline:
        victim = (await pipeline.health())["stages"]["s1"]["pid"]

        async def caller() -> None:
            with pytest.raises(RequestFailed, match=r"process 'p_s1' \(stages s1\) died") as info:
                await pipeline.submit("r", "x")
            assert info.value.error_type == "ProcessDied"

        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            await until_held(pipeline, "s1")
            os.kill(victim, signal.SIGKILL)
        await until_alive(pipeline, "s1", timeout=120)
        health = await pipeline.health()
        assert health["stages"]["s1"]["restarts"] == 1
        assert health["stages"]["s1"]["pid"] != victim
        assert await pipeline.submit("after", "y", timeout=120) == {"raw_inputs": "y"}
        await settled(pipeline, timeout=60)
    assert our_shm() == []


async def test_leaving_stops_every_actor(cluster: Any) -> None:
    config = attrs.evolve(chain_config(2, process=True), placement="ray")
    async with open_pipeline(config) as pipeline:
        assert await pipeline.submit("r", "x") == {"raw_inputs": "x"}
        pids = {s["pid"] for s in (await pipeline.health())["stages"].values()}
    with trio.fail_after(60):
        while pids & descendants(os.getpid()):
            await trio.sleep(0.1)  # ray.kill is asynchronous; the raylet ends the workers
    assert our_shm() == []


OWN_CLUSTER = """
import glob, attrs, trio
from omnitrio import open_pipeline
from tests.pipelines import chain_config

async def main():
    before = set(glob.glob("/tmp/otray-*"))
    async with open_pipeline(attrs.evolve(chain_config(2, process=True), placement="ray")) as pipeline:
        print(sorted(set(glob.glob("/tmp/otray-*")) - before)[0])
        print(await pipeline.submit("r", "x"))

trio.run(main)
"""


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def test_without_a_cluster_the_pipeline_starts_one_and_leaves_nothing_behind() -> None:
    run = await trio.run_process([sys.executable, "-c", OWN_CLUSTER], capture_stdout=True, capture_stderr=True)
    temp, result = run.stdout.decode().splitlines()[-2:]
    assert result == "{'raw_inputs': 'x'}"
    assert not os.path.exists(temp)
    assert processes_mentioning(temp) == []


async def test_replicas_on_ray_share_requests_and_fail_alone(cluster: Any) -> None:
    await kill_one_replica(attrs.evolve(slow_replicated_chain(), placement="ray"))


TICKING = """
import trio
from omnitrio.placement.cluster import open_ray_cluster

async def main():
    ticks = 0

    async def tick():
        nonlocal ticks
        while True:
            await trio.sleep(0.01)
            ticks += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        async with open_ray_cluster(num_cpus=1) as ray:
            print(ticks, ray.is_initialized())
        nursery.cancel_scope.cancel()

trio.run(main)
"""


async def test_the_event_loop_keeps_running_while_a_cluster_starts() -> None:
    run = await trio.run_process([sys.executable, "-c", TICKING], capture_stdout=True, capture_stderr=True)
    ticks, initialized = run.stdout.decode().split()[-2:]
    assert initialized == "True"
    assert int(ticks) >= 20  # importing Ray and starting a cluster take seconds; a blocked loop ticks 0 times
