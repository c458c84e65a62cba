"""A stage reports ready only once its scheduler's warm-up has run (the start-up events say what it
warmed, before the pipeline says ready), inline and in a stage process; a warm-up past the stage's
``warm_up_timeout`` fails the start, naming the stage."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from omnitrio import ConfigError, PipelineConfig, StageConfig, open_pipeline
from omnitrio.config import validate
from omnitrio.errors import StartupError
from omnitrio.events import EVENT_DIR_ENV, FILE_PATTERN, PIPELINE_READY, STAGE_WARM, Event
from tests import warm_stages
from tests.warm_stages import W


def one_stage(factory: str, process: bool, **options: object) -> PipelineConfig:
    stage = StageConfig(
        name="warm", process="p_warm" if process else None, factory_path=f"{W}.{factory}", terminal=True
    )
    for field, value in options.items():
        setattr(stage, field, value)
    return PipelineConfig(stages=[stage])


def events(directory: Path) -> list[Event]:
    decoder = msgspec.json.Decoder(Event)
    return [decoder.decode(line) for path in directory.glob(FILE_PATTERN) for line in path.read_bytes().splitlines()]


@pytest.fixture
def gate() -> Iterator[None]:
    warm_stages.GATE.clear()
    yield
    warm_stages.GATE.set()  # ends a warm-up this process left waiting


@pytest.mark.parametrize("process", [False, True], ids=["inline", "process"])
async def test_a_stage_reports_ready_only_after_its_warm_up_ran(
    process: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(EVENT_DIR_ENV, str(tmp_path))
    config = one_stage("create_warmed", process)
    config.stages[0].factory = {"steps": ["text", "audio"]}  # type: ignore[assignment]
    async with open_pipeline(config) as pipeline:
        assert await pipeline.submit("r1", "hi") == {"raw_inputs": "hi"}
    found = events(tmp_path)
    warm = [e for e in found if e.event == STAGE_WARM and e.stage == "warm"]
    ready = [e for e in found if e.event == PIPELINE_READY]
    assert len(warm) == 1 and len(ready) == 1
    assert warm[0].fields["warmed"] == ["text", "audio"]
    assert warm[0].t_ns < ready[0].t_ns


@pytest.mark.parametrize("process", [False, True], ids=["inline", "process"])
async def test_a_warm_up_past_its_deadline_fails_the_start_naming_the_stage(process: bool, gate: None) -> None:
    config = one_stage("create_slow_warm_up", process, warm_up_timeout=0.5)
    with pytest.raises(
        StartupError, match=r"stage 'warm': its scheduler did not warm up within 0.5 s \(warm_up_timeout\)"
    ):
        async with open_pipeline(config):
            pass


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), True, "3"])
def test_warm_up_timeout_is_validated(value: object) -> None:
    config = one_stage("create_slow_warm_up", False, warm_up_timeout=value)
    with pytest.raises(ConfigError, match=r"stages\[0\] \('warm'\): warm_up_timeout: must be"):
        validate(config)
