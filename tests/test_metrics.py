"""Pipeline metrics: the prometheus registry `/metrics` exposes, fed from the coordinator's events."""

from __future__ import annotations

import re
from typing import Any

import prometheus_client
import pytest

from omnitrio import open_pipeline
from omnitrio.events import EventRecorder, combine_hooks
from omnitrio.metrics import PipelineMetrics
from tests.pipelines import chain_config


def scrape(metrics: PipelineMetrics) -> str:
    return prometheus_client.generate_latest(metrics.registry).decode()


def sample(text: str, name: str, labels: str = "") -> float | None:
    """The value of ``name{labels}`` in exposition ``text`` (labels as prometheus_client sorts them)."""
    series = f"{name}{{{labels}}}" if labels else name
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    return None if match is None else float(match.group(1))


def feed(metrics: PipelineMetrics, *events: tuple[str, str, dict[str, Any]]) -> None:
    for rid, name, fields in events:
        metrics.on_event(rid, name, fields)


def test_fresh_registry_exports_every_metric() -> None:
    text = scrape(PipelineMetrics())
    for name, kind in [
        ("omnitrio_requests_in_flight", "gauge"),
        ("omnitrio_stage_active_requests", "gauge"),
        ("omnitrio_stage_queue_depth", "gauge"),
        ("omnitrio_request_latency_seconds", "histogram"),
        ("omnitrio_time_to_first_token_seconds", "histogram"),
        ("omnitrio_time_to_first_audio_seconds", "histogram"),
        ("omnitrio_requests_total", "counter"),
        ("omnitrio_stage_failures_total", "counter"),
        ("omnitrio_aborts_total", "counter"),
    ]:
        assert f"# TYPE {name} {kind}\n" in text
    assert sample(text, "omnitrio_requests_total", 'outcome="completed"') == 0


def test_completed_request_observes_latency_and_first_token_and_audio() -> None:
    metrics = PipelineMetrics()
    feed(
        metrics,
        ("r1", "request_submitted", {}),
        ("r1", "first_stream_chunk", {"from_stage": "thinker", "modality": "text"}),
        ("r1", "first_stream_chunk", {"from_stage": "vocoder", "modality": "audio"}),
        ("r1", "terminal_response", {"from_stage": "vocoder"}),
    )
    text = scrape(metrics)
    assert sample(text, "omnitrio_requests_total", 'outcome="completed"') == 1
    assert sample(text, "omnitrio_request_latency_seconds_count") == 1
    assert sample(text, "omnitrio_time_to_first_token_seconds_count") == 1
    assert sample(text, "omnitrio_time_to_first_audio_seconds_count") == 1
    assert sample(text, "omnitrio_requests_in_flight") == 0


def test_in_flight_counts_submitted_requests_until_they_end() -> None:
    metrics = PipelineMetrics()
    feed(metrics, ("r1", "request_submitted", {}), ("r2", "request_submitted", {}))
    assert sample(scrape(metrics), "omnitrio_requests_in_flight") == 2
    feed(metrics, ("r1", "terminal_response", {"from_stage": "s"}))
    assert sample(scrape(metrics), "omnitrio_requests_in_flight") == 1


def test_only_the_first_chunk_of_each_kind_is_observed() -> None:
    metrics = PipelineMetrics()
    feed(
        metrics,
        ("r1", "request_submitted", {}),
        ("r1", "first_stream_chunk", {"from_stage": "a", "modality": "tokens"}),
        ("r1", "first_stream_chunk", {"from_stage": "b", "modality": "text"}),
        ("r1", "first_stream_chunk", {"from_stage": "c", "modality": "image"}),
        ("r1", "first_stream_chunk", {"from_stage": "d", "modality": None}),
    )
    text = scrape(metrics)
    assert sample(text, "omnitrio_time_to_first_token_seconds_count") == 1
    assert sample(text, "omnitrio_time_to_first_audio_seconds_count") == 0


def test_failure_is_counted_per_stage_and_error_type() -> None:
    metrics = PipelineMetrics()
    feed(
        metrics,
        ("r1", "request_submitted", {}),
        ("r1", "request_failed", {"stage": "talker", "error_type": "ValueError"}),
    )
    text = scrape(metrics)
    assert sample(text, "omnitrio_stage_failures_total", 'error_type="ValueError",stage="talker"') == 1
    assert sample(text, "omnitrio_requests_total", 'outcome="failed"') == 1
    assert sample(text, "omnitrio_request_latency_seconds_count") == 0


def test_a_failure_is_also_logged_with_its_stage_and_message(caplog: pytest.LogCaptureFixture) -> None:
    failed = {"stage": "talker", "error_type": "ValueError", "message": "no voice"}
    feed(PipelineMetrics(), ("r1", "request_submitted", {}), ("r1", "request_failed", failed))
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "'r1' failed at stage 'talker': ValueError: no voice" in caplog.text


def test_abort_is_counted_by_reason() -> None:
    metrics = PipelineMetrics()
    feed(metrics, ("r1", "request_submitted", {}), ("r1", "request_aborted", {"reason": "timeout"}))
    text = scrape(metrics)
    assert sample(text, "omnitrio_aborts_total", 'reason="timeout"') == 1
    assert sample(text, "omnitrio_requests_total", 'outcome="aborted"') == 1
    assert sample(text, "omnitrio_requests_in_flight") == 0


def test_rejected_request_is_counted_without_entering_flight() -> None:
    metrics = PipelineMetrics()
    feed(metrics, ("r1", "request_rejected", {"reason": "max_in_flight"}))
    text = scrape(metrics)
    assert sample(text, "omnitrio_requests_total", 'outcome="rejected"') == 1
    assert sample(text, "omnitrio_requests_in_flight") == 0


def test_end_events_for_requests_never_submitted_are_ignored() -> None:
    metrics = PipelineMetrics()
    feed(
        metrics,
        ("r1", "request_submitted", {}),
        ("r1", "terminal_response", {"from_stage": "s"}),
        ("r1", "request_failed", {"stage": "s", "error_type": "E"}),
    )
    text = scrape(metrics)
    assert sample(text, "omnitrio_requests_total", 'outcome="failed"') == 0
    assert sample(text, "omnitrio_requests_in_flight") == 0


def test_stage_gauges_are_read_from_stage_health_at_each_scrape() -> None:
    health = {"thinker": {"active_requests": 3, "queue_depth": 1}}
    metrics = PipelineMetrics(stage_health=lambda: health)
    text = scrape(metrics)
    assert sample(text, "omnitrio_stage_active_requests", 'stage="thinker"') == 3
    assert sample(text, "omnitrio_stage_queue_depth", 'stage="thinker"') == 1
    health["thinker"] = {"active_requests": 0, "queue_depth": 0, "aborts": 4}
    text = scrape(metrics)
    assert sample(text, "omnitrio_stage_active_requests", 'stage="thinker"') == 0
    assert sample(text, "omnitrio_stage_aborts_total", 'stage="thinker"') == 4


def test_a_failing_stage_health_leaves_the_rest_of_the_scrape_intact(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> dict[str, dict[str, int]]:
        raise RuntimeError("stage process unreachable")

    metrics = PipelineMetrics()
    metrics.set_stage_health(broken)
    text = scrape(metrics)
    assert "# TYPE omnitrio_stage_queue_depth gauge" in text
    assert sample(text, "omnitrio_requests_in_flight") == 0
    assert "stage_health() failed" in caplog.text


def test_first_chunk_of_an_unknown_modality_is_refused() -> None:
    with pytest.raises(ValueError, match="'image'"):
        PipelineMetrics().first_chunk("image", 0.1)


def test_unknown_outcome_is_refused() -> None:
    with pytest.raises(ValueError, match="'weird'"):
        PipelineMetrics().request_finished("weird")


def test_each_pipeline_gets_its_own_registry() -> None:
    first, second = PipelineMetrics(), PipelineMetrics()
    first.request_started()
    assert sample(scrape(second), "omnitrio_requests_in_flight") == 0


async def test_coordinator_events_of_a_real_pipeline_feed_metrics_and_recorder() -> None:
    metrics, recorder = PipelineMetrics(), EventRecorder.in_memory()
    async with open_pipeline(chain_config(2), inline=True) as pipeline:
        pipeline.coordinator.on_event = combine_hooks(metrics.on_event, recorder.coordinator_event)
        await pipeline.submit("r1", "hello")
    text = scrape(metrics)
    assert sample(text, "omnitrio_requests_total", 'outcome="completed"') == 1
    assert sample(text, "omnitrio_request_latency_seconds_count") == 1
    recorder.flush()
    assert [e.event for e in recorder.events] == ["request_submitted", "terminal_response"]
