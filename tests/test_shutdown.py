"""Leaving ``open_pipeline`` is bounded: a scheduler whose ``stop()`` does not end its ``start()``
is left behind after ``scheduler_stop_timeout``, with a warning naming its stage; a stage
process exits anyway and leaves nothing in /dev/shm.  A stage process leaves within the stop
grace, never killed, whatever else its process holds at exit (a thread that never looks at a
stop, a finalizer that blocks) and also while it is still starting, and still runs its ``atexit``
hooks."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator

import pytest
import trio

from omnitrio import ConfigError, FactoryArgs, PipelineConfig, StageConfig, open_pipeline
from omnitrio.config import validate
from omnitrio.errors import StartupError
from tests import route_stages
from tests.exit_stages import E
from tests.route_stages import R
from tests.warm_stages import W

WATCHDOG_S = 30.0
"""Past this a watchdog ends the stuck scheduler itself, so a shutdown that waits for it fails, not hangs."""


def stuck_config(process: bool) -> PipelineConfig:
    return PipelineConfig(
        stages=[
            StageConfig(
                name="stuck",
                process="p_stuck" if process else None,
                factory_path=f"{R}.create_stuck",
                terminal=True,
                scheduler_stop_timeout=0.5,
            )
        ]
    )


@pytest.fixture
def watchdog() -> Iterator[threading.Event]:
    """Set when the watchdog had to end a stuck scheduler of this process; every one is ended after the test."""
    fired = threading.Event()

    def end_them() -> None:
        for scheduler in route_stages.STUCK:
            scheduler.inbox.put(None)

    def fire() -> None:
        fired.set()
        end_them()

    timer = threading.Timer(WATCHDOG_S, fire)
    timer.start()
    yield fired
    timer.cancel()
    end_them()
    route_stages.STUCK.clear()


def shm_segments() -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"omnitrio-{os.getpid()}-")]


async def test_leaving_the_pipeline_leaves_a_stuck_scheduler_behind_naming_its_stage(
    watchdog: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="omnitrio.bridge")
    async with open_pipeline(stuck_config(False), inline=True) as pipeline:
        assert await pipeline.submit("r1", "hi") == {"raw_inputs": "hi"}
    assert not watchdog.is_set(), "shutdown waited for the stuck scheduler until the watchdog ended it"
    assert route_stages.STUCK[0].stopped.is_set()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("stage 'stuck'" in w and "scheduler_stop_timeout" in w for w in warnings), warnings


async def test_a_stage_process_with_a_stuck_scheduler_exits_and_cleans_up(
    watchdog: threading.Event, capfd: pytest.CaptureFixture[str]
) -> None:
    before = shm_segments()
    with trio.fail_after(WATCHDOG_S):
        async with open_pipeline(stuck_config(True)) as pipeline:
            assert await pipeline.submit("r1", "hi") == {"raw_inputs": "hi"}
            pid = (await pipeline.health())["stages"]["stuck"]["pid"]
    err = capfd.readouterr().err
    assert "stage 'stuck'" in err and "scheduler_stop_timeout" in err, err
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert shm_segments() == before


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), True, "3"])
def test_scheduler_stop_timeout_is_validated(value: object) -> None:
    config = stuck_config(False)
    config.stages[0].scheduler_stop_timeout = value  # type: ignore[assignment]
    with pytest.raises(ConfigError, match=r"stages\[0\] \('stuck'\): scheduler_stop_timeout: must be"):
        validate(config)


def one_process(factory: str, **kwargs: object) -> PipelineConfig:
    stage = StageConfig(
        name="leaver",
        process="p_leaver",
        factory_path=f"{E}.{factory}",
        factory=FactoryArgs(**kwargs),
        terminal=True,
        scheduler_stop_timeout=0.5,
    )
    return PipelineConfig(stages=[stage])


@pytest.mark.parametrize("factory", ["create_lingering_thread", "create_blocking_finalizer"])
async def test_a_stage_process_leaves_within_the_grace_whatever_its_process_still_holds(
    factory: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="omnitrio.children")
    async with open_pipeline(one_process(factory)) as pipeline:
        assert await pipeline.submit("r1", "hi") == {"raw_inputs": "hi"}
        pid = (await pipeline.health())["stages"]["leaver"]["pid"]
    killed = [r.getMessage() for r in caplog.records if "killed it" in r.getMessage()]
    assert killed == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_a_stage_process_runs_its_exit_hooks(tmp_path: object) -> None:
    base = str(tmp_path)
    async with open_pipeline(one_process("create_temporary_directory", base=base)) as pipeline:
        assert await pipeline.submit("r1", "hi") == {"raw_inputs": "hi"}
        assert len(os.listdir(base)) == 1
    assert os.listdir(base) == []


async def test_a_stage_process_still_warming_up_when_the_pipeline_stops_leaves_within_the_grace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="omnitrio.children")
    config = PipelineConfig(
        stages=[
            StageConfig(name="slow", process="p_slow", factory_path=f"{W}.create_slow_warm_up", next="broken"),
            StageConfig(name="broken", process="p_broken", factory_path=f"{W}.create_broken", terminal=True),
        ]
    )
    with pytest.raises(StartupError, match="this stage never starts"):
        async with open_pipeline(config):
            pass
    killed = [r.getMessage() for r in caplog.records if "killed it" in r.getMessage()]
    assert killed == []
