"""Prometheus metrics of one pipeline, ready for ``/metrics``.

:class:`PipelineMetrics` owns a ``prometheus_client`` registry (its own unless one is
given).  Request-level metrics live in the parent process, where the coordinator runs;
the simplest way to feed them is to make :meth:`PipelineMetrics.on_event` (or a
:func:`omnitrio.events.combine_hooks` of it and a recorder) the coordinator's
``on_event`` hook — it turns the coordinator's events into the calls below.  Stage gauges
are read at scrape time from a synchronous ``stage_health()`` function the runtime
supplies, returning ``{stage: {"active_requests": n, "queue_depth": m}}`` (cached values
are fine; a key left out is not exported; a function that raises is logged and the scrape
still answers); the request-age gauges likewise from ``request_ages()`` (the coordinator's
:meth:`~omnitrio.coordinator.Coordinator.request_ages`).

Metric names and labels::

    omnitrio_requests_in_flight                        gauge
    omnitrio_requests_overdue                          gauge      live past their deadline (from request_ages)
    omnitrio_oldest_request_age_seconds                gauge      (from request_ages; absent when none is live)
    omnitrio_stage_active_requests{stage}              gauge      (from stage_health)
    omnitrio_stage_queue_depth{stage}                  gauge      (from stage_health)
    omnitrio_stage_aborts_total{stage}                 counter    (from stage_health "aborts", optional)
    omnitrio_replica_active_requests{stage, process}   gauge      (from stage_health "replicas", optional:
    omnitrio_replica_queue_depth{stage, process}       gauge       {process: {...}} of a replicated stage)
    omnitrio_request_latency_seconds                   histogram  submit → result, completed requests only
    omnitrio_time_to_first_token_seconds               histogram  submit → first text/tokens chunk
    omnitrio_time_to_first_audio_seconds               histogram  submit → first audio chunk
    omnitrio_requests_total{outcome}                   counter    completed | failed | invalid | aborted | rejected
    omnitrio_stage_failures_total{stage, error_type}   counter   (each failure is also logged, as a warning)
    omnitrio_client_errors_total{stage, code}          counter    refused as the caller's mistake (``invalid``):
                                                                  not a stage failure
    omnitrio_aborts_total{reason}                      counter

These count *pipeline* requests: a realtime session makes many (one per ASR command). What users
asked (HTTP requests, realtime sessions and responses) is ``omnitrio_api_requests_total``
(:mod:`omnitrio.serve.api_metrics`).

All methods are for the coordinator's thread; prometheus_client itself is thread-safe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import omnitrio.events as events

log = logging.getLogger(__name__)

StageHealth = Callable[[], Mapping[str, Mapping[str, Any]]]
RequestAgesFn = Callable[[], Any]
"""Returns an object with ``overdue`` (int) and ``oldest_s`` (float or None)."""

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
FIRST_CHUNK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
OUTCOMES = ("completed", "failed", "invalid", "aborted", "rejected")

_FIRST_CHUNK_KIND = {"text": "token", "tokens": "token", "token": "token", "audio": "audio"}


@attrs.define
class _Live:
    """What the metrics remember of one request between its submission and its end."""

    started: float
    firsts: set[str] = attrs.field(factory=set)


class PipelineMetrics:
    """The pipeline's metrics; expose :attr:`registry` (``Pipeline.metrics_registry``) at ``/metrics``."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        stage_health: StageHealth | None = None,
        request_ages: RequestAgesFn | None = None,
    ) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        r = self.registry
        self.in_flight = Gauge("omnitrio_requests_in_flight", "Requests submitted and not yet finished", registry=r)
        self.latency = Histogram(
            "omnitrio_request_latency_seconds",
            "End-to-end latency of completed requests, submit to terminal result",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "omnitrio_time_to_first_token_seconds",
            "Submit to the first text/tokens stream chunk",
            buckets=FIRST_CHUNK_BUCKETS,
            registry=r,
        )
        self.ttfa = Histogram(
            "omnitrio_time_to_first_audio_seconds",
            "Submit to the first audio stream chunk",
            buckets=FIRST_CHUNK_BUCKETS,
            registry=r,
        )
        self.requests = Counter("omnitrio_requests", "Finished requests by outcome", ["outcome"], registry=r)
        # Every outcome is exported from the start, at 0; its child is kept (labels() costs a lock and a lookup).
        self._finished = {outcome: self.requests.labels(outcome) for outcome in OUTCOMES}
        self.stage_failures = Counter(
            "omnitrio_stage_failures", "Requests failed by a stage", ["stage", "error_type"], registry=r
        )
        self.client_errors = Counter(
            "omnitrio_client_errors", "Requests a stage refused as the caller's mistake", ["stage", "code"], registry=r
        )
        self.aborts = Counter("omnitrio_aborts", "Aborted requests by reason", ["reason"], registry=r)
        self._stage_collector = _StageCollector(stage_health)
        r.register(self._stage_collector)
        if request_ages is not None:
            r.register(_RequestAgeCollector(request_ages))
        self._live: dict[str, _Live] = {}

    def set_stage_health(self, stage_health: StageHealth | None) -> None:
        """Use ``stage_health`` for the stage gauges from the next scrape on."""
        self._stage_collector.stage_health = stage_health

    # -- direct API -------------------------------------------------------------------

    def request_started(self) -> None:
        self.in_flight.inc()

    def first_chunk(self, modality: str, seconds: float) -> None:
        """A request's first ``text``/``tokens`` (time to first token) or ``audio`` chunk, ``seconds`` after submit."""
        kind = _FIRST_CHUNK_KIND.get(modality)
        if kind is None:
            raise ValueError(f"first_chunk: modality must be text, tokens or audio, got {modality!r}")
        self._first_chunk_histogram(kind).observe(seconds)

    def _first_chunk_histogram(self, kind: str) -> Histogram:
        return self.ttfa if kind == "audio" else self.ttft

    def request_finished(self, outcome: str, seconds: float | None = None) -> None:
        """A started request ended; ``seconds`` (submit to result) is observed for completed ones."""
        if outcome not in OUTCOMES or outcome == "rejected":
            raise ValueError(
                f"request_finished: outcome must be completed, failed, invalid or aborted, got {outcome!r}"
            )
        self.in_flight.dec()
        self._finished[outcome].inc()
        if outcome == "completed" and seconds is not None:
            self.latency.observe(seconds)

    def request_rejected(self) -> None:
        """Admission refused a request (it never started)."""
        self._finished["rejected"].inc()

    def stage_failed(self, stage: str, error_type: str) -> None:
        self.stage_failures.labels(stage, error_type).inc()

    def aborted(self, reason: str) -> None:
        self.aborts.labels(reason).inc()

    # -- from the coordinator's events ------------------------------------------------

    def on_event(self, request_id: str, name: str, fields: Mapping[str, Any]) -> None:
        """The coordinator's ``on_event`` hook: update the metrics from one coordinator event.

        Relies on each ``request_submitted`` being followed by exactly one of
        ``terminal_response``, ``request_failed``, ``request_invalid`` or ``request_aborted`` for that id (which
        forgets the request); ``first_stream_chunk`` events after the first of each kind
        (token / audio) are ignored, as are events for ids it has not seen submitted.
        """
        now = time.perf_counter()
        match name:
            case events.REQUEST_SUBMITTED:
                self._live[request_id] = _Live(now)
                self.request_started()
            case events.FIRST_STREAM_CHUNK:
                live = self._live.get(request_id)
                kind = _FIRST_CHUNK_KIND.get(str(fields.get("modality")))
                if live is not None and kind is not None and kind not in live.firsts:
                    live.firsts.add(kind)
                    self._first_chunk_histogram(kind).observe(now - live.started)
            case events.TERMINAL_RESPONSE:
                live = self._live.pop(request_id, None)
                if live is not None:
                    self.request_finished("completed", now - live.started)
            case events.REQUEST_FAILED:
                if self._live.pop(request_id, None) is not None:
                    stage, error_type = str(fields.get("stage", "unknown")), str(fields.get("error_type", "unknown"))
                    log.warning(
                        "request %r failed at stage %r: %s: %s",
                        request_id,
                        stage,
                        error_type,
                        fields.get("message", ""),
                    )
                    self.stage_failed(stage, error_type)
                    self.request_finished("failed")
            case events.REQUEST_INVALID:
                if self._live.pop(request_id, None) is not None:
                    self.client_errors.labels(str(fields.get("stage", "unknown")), str(fields.get("code", ""))).inc()
                    self.request_finished("invalid")
            case events.REQUEST_ABORTED:
                if self._live.pop(request_id, None) is not None:
                    self.aborted(str(fields.get("reason", "unknown")))
                    self.request_finished("aborted")
            case events.REQUEST_REJECTED:
                self.request_rejected()
            case _:
                return


class _RequestAgeCollector(Collector):
    """How many requests are past their deadline and how old the oldest is, read at scrape time."""

    def __init__(self, request_ages: RequestAgesFn) -> None:
        self.request_ages = request_ages

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        overdue, oldest = self._families()
        try:
            ages = self.request_ages()
        except Exception:
            log.exception("metrics: request_ages() failed; the request-age gauges are empty for this scrape")
            yield from self._families()
            return
        overdue.add_metric([], float(ages.overdue))
        if ages.oldest_s is not None:
            oldest.add_metric([], float(ages.oldest_s))
        yield from (overdue, oldest)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily("omnitrio_requests_overdue", "Live requests past their deadline"),
            GaugeMetricFamily("omnitrio_oldest_request_age_seconds", "Age of the oldest live request"),
        )


class _StageCollector(Collector):
    """Stage gauges read from ``stage_health()`` at scrape time."""

    def __init__(self, stage_health: StageHealth | None) -> None:
        self.stage_health = stage_health

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        active, depth, aborts, replica_active, replica_depth = families
        health = self.stage_health
        if health is not None:
            try:
                report = health()
                for stage, values in report.items():
                    if "active_requests" in values:
                        active.add_metric([stage], float(values["active_requests"]))
                    if "queue_depth" in values:
                        depth.add_metric([stage], float(values["queue_depth"]))
                    if "aborts" in values:
                        aborts.add_metric([stage], float(values["aborts"]))
                    for process, figures in values.get("replicas", {}).items():
                        replica_active.add_metric([stage, process], float(figures["active_requests"]))
                        replica_depth.add_metric([stage, process], float(figures["queue_depth"]))
            except Exception:
                log.exception("metrics: stage_health() failed; the stage gauges are empty for this scrape")
                families = self._families()
        yield from families

    @staticmethod
    def _families() -> tuple[
        GaugeMetricFamily, GaugeMetricFamily, CounterMetricFamily, GaugeMetricFamily, GaugeMetricFamily
    ]:
        return (
            GaugeMetricFamily(
                "omnitrio_stage_active_requests", "Requests a stage holds any state for", labels=["stage"]
            ),
            GaugeMetricFamily(
                "omnitrio_stage_queue_depth", "Requests waiting at a stage before its scheduler", labels=["stage"]
            ),
            CounterMetricFamily("omnitrio_stage_aborts", "Requests aborted at a stage", labels=["stage"]),
            GaugeMetricFamily(
                "omnitrio_replica_active_requests",
                "Requests one replica of a stage holds any state for",
                labels=["stage", "process"],
            ),
            GaugeMetricFamily(
                "omnitrio_replica_queue_depth",
                "Requests waiting at one replica of a stage before its scheduler",
                labels=["stage", "process"],
            ),
        )
