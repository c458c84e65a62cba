"""A real pipeline leaves a request timeline that `omnitrio trace` summarises."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnitrio import open_pipeline, trace
from tests.pipelines import fan_config


@pytest.mark.parametrize("process", [False, True])
async def test_pipeline_events_summarise_per_stage_and_per_hop(
    process: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OMNITRIO_EVENT_DIR", str(tmp_path))
    async with open_pipeline(fan_config(process=process), inline=not process) as pipeline:
        for i in range(5):
            await pipeline.submit(f"r{i}", f"some words {i}")
    files = list(tmp_path.glob("events_*.jsonl"))
    assert len(files) == (5 if process else 1)  # the parent and each stage process
    assert trace.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in ("words", "upper", "count", "join", "words -> upper", "count -> join"):
        assert name in out
    assert trace.main([str(tmp_path), "--request", "r3"]) == 0
    timeline = capsys.readouterr().out
    assert "request_submitted" in timeline and "terminal_response" in timeline
