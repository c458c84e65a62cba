"""Stages in spawned processes: seed experiments, relay, supervision, clean shutdown."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from omnitrio import FactoryArgs, PipelineConfig, RequestFailed, StageConfig, open_pipeline
from omnitrio.errors import StartupError
from tests.pipelines import T, chain_config, fan_config, settled, until_alive, until_held
from tests.test_seed_experiments import SEEDS, assert_prints_the_seed_output, ten_bursts_form_one_batch_each


def our_shm() -> list[str]:
    """Shared memory of pipelines this test process opened (their names carry our pid)."""
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"omnitrio-{os.getpid()}-")]


def our_children() -> list[str]:
    """Live stage processes of pipelines this test process opened."""
    mark = f"OMNITRIO_PARENT_PID={os.getpid()}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(entry.name)
            except OSError:
                continue
    return found


@pytest.fixture(autouse=True)
def no_leftovers() -> None:
    before = set(our_shm())
    yield
    assert set(our_shm()) - before == set()


@pytest.mark.parametrize("name", list(SEEDS))
async def test_seed_experiment_in_processes_prints_the_seed_output(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await assert_prints_the_seed_output(name, False, capsys)


async def test_each_process_group_is_its_own_process_and_shared_groups_share_one() -> None:
    config = chain_config(3, process=True, factory="create_pid")
    config.stages[2].process = config.stages[1].process
    async with open_pipeline(config) as pipeline:
        result = await pipeline.submit("r", "x")
        health = await pipeline.health()
    pids = result["pids"]
    assert pids[0] != pids[1] and pids[1] == pids[2] and os.getpid() not in pids
    assert health["stages"]["s0"]["pid"] == pids[0]
    assert health["stages"]["s2"]["process"] == "p_s1"


@pytest.mark.skipif(sys.platform != "linux", reason="niceness is per thread on Linux only")
@pytest.mark.parametrize(("nice", "process"), [(None, True), (5, True), (7, False)])
async def test_scheduler_nice_lowers_the_priority_of_a_stage_process_scheduler_thread(
    nice: int | None, process: bool
) -> None:
    config = chain_config(1, process=process, factory="create_niceness")
    if nice is not None:
        config.scheduler_nice = nice
    async with open_pipeline(config) as pipeline:
        seen = await pipeline.submit("r", "x")
    expected = 0 if nice is None or not process else nice  # off by default; inline stages share our process
    assert seen["scheduler"] == min(seen["main"] + expected, 19)


async def cross_tensors(device: str) -> dict[str, Any]:
    """Tensors made on ``device`` in one process, summarised in another; checks what arrived."""
    n = 1 << 20  # 4 MB: through shared memory, not pickle
    config = PipelineConfig(
        stages=[
            StageConfig(
                name="make",
                process="p1",
                factory_path=f"{T}.create_tensor_maker",
                factory={"device": device},
                next="check",
            ),
            StageConfig(name="check", process="p2", factory_path=f"{T}.create_tensor_summary", terminal=True),
        ]
    )
    async with open_pipeline(config) as pipeline:
        out: dict[str, Any] = await pipeline.submit("r", n)
        await settled(pipeline)
    assert out["big_sum"] == float(sum(range(n)))
    assert out["big_len"] == n
    assert out["half"] == [float(i) for i in range(16)]
    assert out["bf16_dtype"] == "torch.bfloat16"
    assert out["transposed"] == [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]]
    assert out["empty_shape"] == [0, 5]
    assert out["flags"] == [True, False]
    assert out["tail"].tolist() == [n - 3, n - 2, n - 1]
    return out


async def test_tensors_cross_processes_intact() -> None:
    out = await cross_tensors("cpu")
    assert out["devices"] == ["cpu"]


@pytest.mark.gpu
async def test_cuda_tensors_cross_processes_onto_the_same_device() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    out = await cross_tensors("cuda:0")
    assert out["devices"] == ["cuda:0"]  # every tensor arrived on the GPU, not on the host
    assert out["tail"].device == torch.device("cuda:0")  # and back to the caller's process


async def test_views_passed_to_a_stage_in_the_same_process_stay_valid_after_the_first_lets_go() -> None:
    # fill (p1) -> forward (p2) -> late_reader (p2): forward hands its zero-copy view of p1's
    # shared memory to late_reader in-process and finishes; p1 must not reuse that memory
    # for the next request's tensor while late_reader still reads it.
    config = PipelineConfig(
        stages=[
            StageConfig(name="fill", process="p1", factory_path=f"{T}.create_filler", next="forward"),
            StageConfig(name="forward", process="p2", factory_path=f"{T}.create_echo", next="read"),
            StageConfig(name="read", process="p2", factory_path=f"{T}.create_late_reader", terminal=True),
        ]
    )
    async with open_pipeline(config) as pipeline:
        results: dict[int, Any] = {}

        async def one(value: int) -> None:
            results[value] = await pipeline.submit(f"r{value}", value)

        await one(0)  # warm: torch imported everywhere
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, 1)
            await until_held(pipeline, "read")  # r1 is in read's sleep; r2's tensor is packed meanwhile
            nursery.start_soon(one, 2)
        await settled(pipeline)
    assert results[1] == {"value": 1.0, "uniform": True} and results[2] == {"value": 2.0, "uniform": True}


async def test_unpicklable_payload_fails_only_that_request_naming_the_stage() -> None:
    config = chain_config(2, process=True)
    config.stages[0].factory_path = f"{T}.create_unpicklable"
    async with open_pipeline(config) as pipeline:
        with pytest.raises(RequestFailed, match=r"stage 's0'.*cannot cross a process boundary") as info:
            await pipeline.submit("bad", "lambda")
        assert info.value.stage == "s0"
        assert await pipeline.submit("good", "fine") == {"raw_inputs": "fine"}
        await settled(pipeline)


async def test_failures_in_processes_leave_no_state_anywhere() -> None:
    async with open_pipeline(fan_config(process=True)) as pipeline:
        with pytest.raises(RequestFailed, match="stage 'count' raised ValueError"):
            await pipeline.submit("bad", "boom")
        assert (await pipeline.submit("ok", "a b"))["sources"] == ["count", "upper"]
        await settled(pipeline)


async def test_a_killed_stage_process_fails_its_requests_fast_and_is_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = chain_config(2, process=True)
    config.stages[1].factory_path = f"{T}.create_slow"
    config.stages[1].factory = FactoryArgs(seconds=30.0)
    async with open_pipeline(config) as pipeline:
        victim = (await pipeline.health())["stages"]["s1"]["pid"]
        failed_at: list[float] = []

        async def caller() -> None:
            with pytest.raises(RequestFailed, match=r"process 'p_s1' \(stages s1\) died with exit code -9") as info:
                await pipeline.submit("r", "x")
            assert info.value.error_type == "ProcessDied"
            failed_at.append(time.perf_counter())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            await until_held(pipeline, "s1")
            killed_at = time.perf_counter()
            os.kill(victim, signal.SIGKILL)
        assert failed_at[0] - killed_at < 1.0
        assert "'r' failed at stage 's1': ProcessDied: process 'p_s1' (stages s1) died" in caplog.text
        await until_alive(pipeline, "s1", timeout=30)
        health = await pipeline.health()
        assert health["stages"]["s1"]["restarts"] == 1
        assert health["stages"]["s1"]["pid"] != victim
        config_fast = await pipeline.submit("after", "y", timeout=60)
        assert config_fast == {"raw_inputs": "y"}
        await settled(pipeline)


async def test_a_child_whose_factory_raises_fails_start_up_with_its_traceback() -> None:
    config = chain_config(2, process=True)
    config.stages[1].factory_path = f"{T}.create_raises_on_build"
    with pytest.raises(StartupError, match=r"(?s)process 'p_s1'.*failed to start.*cannot load weights on purpose"):
        async with open_pipeline(config):
            pass
    assert our_children() == []


async def test_leaving_the_pipeline_removes_its_endpoint_directory(tmp_path: Path) -> None:
    config = chain_config(2, process=True)
    config.endpoints.base_path = str(tmp_path / "ep")
    async with open_pipeline(config) as pipeline:
        await pipeline.submit("r", "x")
        assert any(p.suffix == ".sock" for p in (tmp_path / "ep").iterdir())
    assert not any(p.suffix == ".sock" for p in (tmp_path / "ep").iterdir())


async def test_a_burst_submitted_together_forms_one_batch_in_a_process_every_time() -> None:
    await ten_bursts_form_one_batch_each(inline=False)


@pytest.mark.parametrize("transport", ["unix", "zmq"])
async def test_both_transports_carry_the_seed_fan_pipeline(transport: str) -> None:
    config = fan_config(process=True)
    config.transport = transport  # type: ignore[assignment]
    async with open_pipeline(config) as pipeline:
        results = await pipeline.submit("r", "hello omni world")
        assert results["sources"] == ["count", "upper"]
        with pytest.raises(RequestFailed, match="stage 'count'"):
            await pipeline.submit("bad", "boom")
        await settled(pipeline)


PARENT_SCRIPT = """
import sys, trio
from omnitrio import open_pipeline
from tests.pipelines import chain_config

async def main():
    config = chain_config(2, process=True, factory="create_tensor_maker")
    config.stages[1].factory_path = "toys.stages.create_tensor_summary"
    config.endpoints.base_path = sys.argv[1]
    async with open_pipeline(config) as pipeline:
        await pipeline.submit("r", 1 << 20)  # leases shared memory across the boundary
        print("ready", flush=True)
        await trio.sleep(60)

trio.run(main)
"""


async def test_children_of_a_killed_parent_exit_and_clean_up(tmp_path: Path) -> None:
    import subprocess
    import sys

    base = tmp_path / "omnitrio-ep"
    parent = await trio.lowlevel.open_process(
        [sys.executable, "-c", PARENT_SCRIPT, str(base)], stdout=subprocess.PIPE, cwd=Path(__file__).parent.parent
    )
    assert parent.stdout is not None
    with trio.fail_after(60):
        assert b"ready" in await parent.stdout.receive_some(100)
    mark = f"OMNITRIO_PARENT_PID={parent.pid}".encode()

    def children() -> list[str]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and mark in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(entry.name)
            except OSError:
                continue
        return found

    assert len(children()) == 3  # the two stage processes and the fork server they are forks of
    parent.kill()  # no chance to clean up: the children must notice and do it
    await parent.wait()
    with trio.fail_after(10):
        while children() or base.exists():
            await trio.sleep(0.05)
    assert [n for n in os.listdir("/dev/shm") if n.startswith(f"omnitrio-{parent.pid}-")] == []
