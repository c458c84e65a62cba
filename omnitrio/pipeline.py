"""What a caller holds inside ``open_pipeline``: submit, stream, abort, health, metrics.

The same object whatever the placement: its health and stage gauges are composed from the
stages in the caller's process and those in stage processes (asked when needed).
"""

from __future__ import annotations

import os
from typing import Any

from omnitrio.children import Children
from omnitrio.config import PipelineConfig
from omnitrio.coordinator import Coordinator
from omnitrio.events import EventRecorder, combine_hooks
from omnitrio.health import Figures, stage_entry
from omnitrio.metrics import PipelineMetrics
from omnitrio.stage import Stage
from omnitrio.topology import MAIN


class Pipeline:
    """A running pipeline; see :func:`omnitrio.open_pipeline`."""

    def __init__(
        self,
        config: PipelineConfig,
        coordinator: Coordinator,
        stages: dict[str, Stage],
        children: Children,
        recorder: EventRecorder | None,
    ) -> None:
        """``stages``: those in this process; ``children``: the stage processes (maybe none)."""
        self.config = config
        self.name: str = config.name or "omnitrio"
        self.coordinator = coordinator
        self.recorder = recorder
        self._stages = stages
        self._children = children
        self.metrics = PipelineMetrics(stage_health=self._stage_gauges, request_ages=coordinator.request_ages)
        self.metrics_registry = self.metrics.registry
        coordinator.on_event = combine_hooks(self.metrics.on_event, recorder.coordinator_event if recorder else None)
        self.submit = coordinator.submit
        """Run one request; return the terminal ``payload.data`` (:meth:`Coordinator.submit`)."""
        self.stream = coordinator.stream
        """Stream one request (:meth:`Coordinator.stream`)."""
        self.abort = coordinator.abort
        """Abort a live request everywhere; True if it was live (:meth:`Coordinator.abort`)."""

    async def health(self) -> dict[str, Any]:
        """``{"requests": n, "overdue_requests": k, "oldest_request_age_s": s | None,
        "stages": {name: {alive, pid, process, active_requests, restarts, dead}}}`` (see
        :mod:`omnitrio.health`).

        ``overdue_requests`` counts requests still held past their deadline (see
        ``Coordinator.request_ages``); ``oldest_request_age_s`` is the age of the oldest live one.
        A stage of a replicated process group also has ``replicas``: each copy's own entry, in
        order; its ``alive`` is True only when every copy is alive, its counts are summed.
        Stage processes are asked (each has a few seconds to answer, or counts as not alive).
        """
        pid = os.getpid()
        stages = {
            name: stage_entry(True, pid, stage.plan.config.process or MAIN, Figures.of(stage))
            for name, stage in self._stages.items()
        }
        stages.update(await self._children.health())
        return {**self.request_health(), "stages": stages}

    def request_health(self) -> dict[str, Any]:
        """The request part of :meth:`health` (synchronous, from the trio thread)."""
        ages = self.coordinator.request_ages()
        oldest = None if ages.oldest_s is None else round(ages.oldest_s, 3)
        return {"requests": ages.live, "overdue_requests": ages.overdue, "oldest_request_age_s": oldest}

    async def refresh_stage_gauges(self) -> None:
        """Ask the stage processes for their gauges, so the next metrics scrape reads current figures."""
        await self._children.health()

    def _stage_gauges(self) -> dict[str, dict[str, int]]:
        """Per stage ``{"active_requests", "queue_depth"}`` for a metrics scrape (synchronous)."""
        gauges = self._children.gauges()
        for name, stage in self._stages.items():
            gauges[name] = {"active_requests": stage.active_requests, "queue_depth": stage.queue_depth}
        return gauges
