"""Scheduler supervision: a crashed scheduler is rebuilt within bounds; one that cannot be is dead,
its requests fail naming it, and the rest of the pipeline serves."""

from __future__ import annotations

import pytest
import trio

from omnitrio import ConfigError, FactoryArgs, PipelineConfig, RequestFailed, StageConfig, open_pipeline
from omnitrio.config import validate
from tests import supervision_stages
from tests.pipelines import T

H = "tests.supervision_stages"


def split_config(key: str, rebuild: str, *, process: bool = False) -> PipelineConfig:
    """front routes each request to ``fragile`` or ``steady`` (both terminal)."""
    return PipelineConfig(
        terminal_stages_fn=f"{H}.terminal_by_input",
        stages=[
            StageConfig(
                name="front",
                factory_path=f"{T}.create_echo",
                next=["fragile", "steady"],
                route_fn=f"{H}.route_by_input",
            ),
            StageConfig(
                name="fragile",
                process="p_fragile" if process else None,
                factory_path=f"{H}.create_fragile",
                factory=FactoryArgs(key=key, rebuild=rebuild),
                terminal=True,
                scheduler_restarts=2,
                scheduler_restart_backoff=0.001,
            ),
            StageConfig(name="steady", factory_path=f"{H}.create_steady", terminal=True),
        ],
    )


async def until_dead(pipeline: object, stage: str) -> RequestFailed:
    """Send requests to ``stage`` until one fails because the stage is dead; that error."""
    n = 0
    with trio.fail_after(20):
        while True:
            n += 1
            with pytest.raises(RequestFailed) as failed:
                await pipeline.submit(f"probe-{n}", "probe")  # type: ignore[attr-defined]
            if failed.value.error_type == "StageDead":
                return failed.value


@pytest.mark.parametrize("rebuild", ["start_raises", "factory_raises"])
async def test_a_stage_that_cannot_be_rebuilt_is_dead_and_the_rest_of_the_pipeline_serves(
    rebuild: str, request: pytest.FixtureRequest
) -> None:
    key = request.node.name
    async with open_pipeline(split_config(key, rebuild), inline=True) as pipeline:
        assert await pipeline.submit("a", "fine") == {"raw_inputs": "fine"}
        with pytest.raises(RequestFailed, match="scheduler crashed"):
            await pipeline.submit("b", "crash")
        error = await until_dead(pipeline, "fragile")
        assert "stage 'fragile' is dead" in str(error)
        assert "gave up after 2 restart(s)" in str(error)
        assert supervision_stages.builds(key) == 3  # the first, then two rebuilds: bounded
        assert await pipeline.submit("s", "steady one") == {"raw_inputs": "steady one"}
        health = await pipeline.health()
        assert health["stages"]["fragile"]["alive"] is False
        assert "is dead" in health["stages"]["fragile"]["dead"]
        assert health["stages"]["steady"]["alive"] is True
        assert health["stages"]["steady"]["dead"] is None


async def test_a_dead_stage_in_a_stage_process_is_reported_dead(request: pytest.FixtureRequest) -> None:
    config = split_config(request.node.name, "start_raises", process=True)
    async with open_pipeline(config) as pipeline:
        with pytest.raises(RequestFailed, match="scheduler crashed"):
            await pipeline.submit("b", "crash")
        await until_dead(pipeline, "fragile")
        assert await pipeline.submit("s", "steady one") == {"raw_inputs": "steady one"}
        entry = (await pipeline.health())["stages"]["fragile"]
        assert entry["alive"] is False
        assert "stage 'fragile' is dead" in entry["dead"]


@pytest.mark.parametrize(
    ("field", "value"), [("scheduler_restarts", -1), ("scheduler_restarts", 1.5), ("scheduler_restart_backoff", -0.1)]
)
def test_restart_policy_fields_are_validated(field: str, value: object) -> None:
    config = split_config("validate", "start_raises")
    setattr(config.stages[1], field, value)
    with pytest.raises(ConfigError, match=rf"stages\[1\] \('fragile'\): {field}: must be"):
        validate(config)
