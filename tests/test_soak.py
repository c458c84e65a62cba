"""A short soak: mixed outcomes and one kill -9 leave no per-request state and no shared memory."""

from __future__ import annotations

import pytest

from toys.soak import fan_pipeline, soak, stream_pipeline


@pytest.mark.slow
@pytest.mark.parametrize(
    ("make", "victim", "requests"), [(fan_pipeline, "upper", 600), (stream_pipeline, "vocoder", 200)]
)
async def test_short_soak_leaves_nothing_behind(make, victim: str, requests: int) -> None:  # type: ignore[no-untyped-def]
    # A request left waiting fails the test (SoakStalled says which and where), before pytest-timeout.
    report = await soak(make(), requests, concurrency=32, kill_stage=victim, deadline=75)
    assert report.unexpected == []
    assert report.leftover_requests == 0
    assert not any(report.leftover_stage_state.values())
    assert report.leftover_shm == []
    assert report.outcomes.get("process_died", 0) + report.outcomes.get("refused_while_restarting", 0) > 0
    assert report.outcomes.get("completed", 0) > 0
