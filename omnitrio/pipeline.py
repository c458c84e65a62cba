"""What a caller holds inside ``open_pipeline``: submit, stream, abort, health.

The same API whether the stages run in the caller's process or in spawned ones; only
:meth:`Pipeline.health` differs (it must ask other processes).
"""

from __future__ import annotations

from typing import Any

from omnitrio.config import PipelineConfig
from omnitrio.coordinator import Coordinator, RequestStream
from omnitrio.events import EventRecorder, combine_hooks, recorder_from_env
from omnitrio.metrics import PipelineMetrics


class Pipeline:
    """A running pipeline; see :func:`omnitrio.open_pipeline`."""

    def __init__(self, config: PipelineConfig, coordinator: Coordinator) -> None:
        self.config = config
        self.name: str = config.name or "omnitrio"
        self.coordinator = coordinator
        self.recorder: EventRecorder | None = recorder_from_env("main")
        self.metrics = PipelineMetrics(stage_health=self._stage_gauges, request_ages=coordinator.request_ages)
        self.metrics_registry = self.metrics.registry
        rec = self.recorder
        coordinator.on_event = combine_hooks(self.metrics.on_event, rec.coordinator_event if rec else None)

    def _stage_gauges(self) -> dict[str, dict[str, int]]:
        """Per stage ``{"active_requests", "queue_depth"}`` for a metrics scrape (synchronous)."""
        return {}

    async def submit(
        self,
        request_id: str,
        inputs: Any,
        *,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Any:
        """Run one request; return the terminal ``payload.data`` (see ``Coordinator.submit``).

        ``params`` and ``metadata`` become the fields of the ``OmniRequest`` every stage sees.
        """
        return await self.coordinator.submit(request_id, inputs, params=params, timeout=timeout, metadata=metadata)

    def stream(
        self,
        request_id: str,
        inputs: Any,
        *,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> RequestStream:
        """Stream one request (see ``Coordinator.stream``)."""
        return self.coordinator.stream(request_id, inputs, params=params, timeout=timeout, metadata=metadata)

    async def abort(self, request_id: str, *, wait: bool = False) -> bool:
        """Abort a live request everywhere; True if it was live (see ``Coordinator.abort``)."""
        return await self.coordinator.abort(request_id, wait=wait)

    async def health(self) -> dict[str, Any]:
        """``{"requests": n, "overdue_requests": k, "oldest_request_age_s": s | None,
        "stages": {name: {alive, pid, process, active_requests, restarts}}}``.

        ``overdue_requests`` counts requests still held past their deadline (see
        ``Coordinator.request_ages``); ``oldest_request_age_s`` is the age of the oldest live one.
        """
        raise NotImplementedError

    def request_health(self) -> dict[str, Any]:
        """The request part of :meth:`health` (synchronous, from the trio thread)."""
        ages = self.coordinator.request_ages()
        oldest = None if ages.oldest_s is None else round(ages.oldest_s, 3)
        return {"requests": ages.live, "overdue_requests": ages.overdue, "oldest_request_age_s": oldest}


def stage_health(alive: bool, pid: int, process: str, active: int, restarts: int) -> dict[str, Any]:
    return {"alive": alive, "pid": pid, "process": process, "active_requests": active, "restarts": restarts}
