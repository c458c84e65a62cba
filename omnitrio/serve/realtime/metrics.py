"""Prometheus figures of realtime responses, in the pipeline's registry (served at ``/metrics``).

=====================================================================  =========  ==================================
``omnitrio_realtime_time_to_first_audio_seconds``                      histogram  ``response.created`` to the first
                                                                                  audio sent
``omnitrio_realtime_audio_rtf``                                        histogram  production time / audio length
``omnitrio_realtime_audio_underruns_total``                            counter    a real-time player ran out
``omnitrio_realtime_interrupt_to_last_audio_seconds``                  histogram  barge-in / cancel to the last
                                                                                  audio byte sent
``omnitrio_realtime_interrupt_to_released_seconds``                    histogram  barge-in / cancel to every stage
                                                                                  having let the request go
``omnitrio_realtime_unplayed_audio_at_interrupt_seconds``              histogram  audio the client held unplayed
``omnitrio_realtime_turn_decision_seconds{part}``                      histogram  ``semantic_vad``'s judgement at a
                                                                                  pause: ``asr``, ``model``,
                                                                                  ``total``
=====================================================================  =========  ==================================

One :class:`RealtimeMetrics` per registry (:func:`realtime_metrics`); a pipeline without a registry
gets a private one, so recording never fails.
"""

from __future__ import annotations

import weakref
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from omnitrio.metrics import FIRST_CHUNK_BUCKETS as _SECONDS

_RATIOS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0)


class RealtimeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.time_to_first_audio = Histogram(
            "omnitrio_realtime_time_to_first_audio_seconds",
            "Realtime responses: response.created to the first audio sent",
            buckets=_SECONDS,
            registry=r,
        )
        self.rtf = Histogram(
            "omnitrio_realtime_audio_rtf",
            "Realtime responses: seconds spent producing the audio per second of audio",
            buckets=_RATIOS,
            registry=r,
        )
        self.underruns = Counter(
            "omnitrio_realtime_audio_underruns",
            "Realtime responses: moments a client playing in real time ran out of audio",
            registry=r,
        )
        self.to_last_audio = Histogram(
            "omnitrio_realtime_interrupt_to_last_audio_seconds",
            "Barge-in or response.cancel to the last audio byte sent (0: none sent after it)",
            buckets=_SECONDS,
            registry=r,
        )
        self.to_released = Histogram(
            "omnitrio_realtime_interrupt_to_released_seconds",
            "Barge-in or response.cancel to every stage having let the response's request go",
            buckets=_SECONDS,
            registry=r,
        )
        self.unplayed = Histogram(
            "omnitrio_realtime_unplayed_audio_at_interrupt_seconds",
            "Audio a client playing in real time held unplayed when the response was interrupted",
            buckets=_SECONDS,
            registry=r,
        )
        self.turn_decision = Histogram(
            "omnitrio_realtime_turn_decision_seconds",
            "semantic_vad: the time one end-of-turn judgement took, by part (asr, model, total)",
            ["part"],
            buckets=_SECONDS,
            registry=r,
        )


_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, RealtimeMetrics] = weakref.WeakKeyDictionary()


def realtime_metrics(registry: Any) -> RealtimeMetrics:
    """The realtime metrics of ``registry`` (created on first use; a private registry for None)."""
    if not isinstance(registry, CollectorRegistry):
        return RealtimeMetrics(CollectorRegistry())
    metrics = _by_registry.get(registry)
    if metrics is None:
        metrics = _by_registry[registry] = RealtimeMetrics(registry)
    return metrics
