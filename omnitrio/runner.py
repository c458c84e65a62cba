"""``open_pipeline``: start a pipeline, hand the caller its API, stop everything on exit.

Stages with ``process`` set run in spawned OS processes (one per distinct name); the
others — or every stage with ``inline=True`` — run in the caller's trio run.  Leaving
the ``async with`` block stops every stage and process and removes the pipeline's
sockets and shared memory, whatever the exit.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from omnitrio.config import PipelineConfig, validate
from omnitrio.coordinator import Coordinator
from omnitrio.envelopes import Complete, Failed, Released, StreamOut, ToCoordinator, ToStage
from omnitrio.errors import StartupError, collapse
from omnitrio.events import flush_periodically
from omnitrio.importing import import_object
from omnitrio.pipeline import Pipeline, stage_health
from omnitrio.stage import Stage
from omnitrio.topology import Topology


def scheduler_builder(config: PipelineConfig, stage_name: str) -> Any:
    """A zero-argument callable that builds the named stage's scheduler."""
    stage = config.stage(stage_name)
    factory = import_object(stage.factory_path)
    kwargs = stage.factory.to_kwargs()

    def build() -> Any:
        try:
            return factory(**kwargs)
        except Exception as exc:
            raise StartupError(f"stage {stage_name!r}: factory {stage.factory_path} raised {exc!r}") from exc

    return build


class LocalSwitchboard:
    """Routes messages between stages and the coordinator inside one process."""

    def __init__(self) -> None:
        self.stages: dict[str, Stage] = {}
        self.coordinator: Coordinator | None = None

    def send(self, envelope: ToStage | ToCoordinator) -> None:
        match envelope:
            case Complete() | StreamOut() | Failed() | Released():
                assert self.coordinator is not None
                self.coordinator.deliver(envelope)
            case _:
                self.stages[envelope.to].deliver(envelope)

    def release(self, leases: Sequence[Any]) -> None:
        return

    def let_go(self, request_id: str, inc: int, stage: str, leases: Sequence[Any]) -> None:
        return  # in one process nothing crosses through shared memory

    def transport_to(self, stage: str) -> str:
        return "local"


class InlinePipeline(Pipeline):
    """Every stage in the caller's process and trio run."""

    def __init__(self, config: PipelineConfig, coordinator: Coordinator, stages: dict[str, Stage]) -> None:
        self._stages = stages
        super().__init__(config, coordinator)

    def _stage_gauges(self) -> dict[str, dict[str, int]]:
        return {
            n: {"active_requests": s.active_requests, "queue_depth": s.queue_depth} for n, s in self._stages.items()
        }

    async def health(self) -> dict[str, Any]:
        pid = os.getpid()
        stages = {
            name: stage_health(True, pid, stage.plan.config.process or "main", stage.active_requests, stage.restarts)
            for name, stage in self._stages.items()
        }
        return {**self.request_health(), "stages": stages}


@asynccontextmanager
async def open_pipeline(config: PipelineConfig, *, inline: bool = False) -> AsyncIterator[Pipeline]:
    """Start ``config``'s stages, yield the :class:`Pipeline`, stop everything on exit.

    Raises :class:`omnitrio.ConfigError` before anything starts when the config is invalid.
    """
    validate(config)
    if not inline and any(s.process for s in config.stages):
        from omnitrio.processes import open_process_pipeline

        async with open_process_pipeline(config) as in_processes:
            yield in_processes
        return
    topology = Topology.compile(config)
    board = LocalSwitchboard()
    coordinator = Coordinator(topology, board.send, topology.plans)
    board.coordinator = coordinator
    pipeline = InlinePipeline(config, coordinator, board.stages)
    for name, plan in topology.plans.items():
        board.stages[name] = Stage(plan, scheduler_builder(config, name), board, pipeline.recorder)
    try:
        async with trio.open_nursery() as nursery:
            if pipeline.recorder is not None:
                nursery.start_soon(flush_periodically, pipeline.recorder)
            async with trio.open_nursery() as starting:
                for stage in board.stages.values():
                    starting.start_soon(nursery.start, stage.run)
            try:
                yield pipeline
            finally:
                coordinator.close()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        single = collapse(group)
        if single is group:
            raise
        raise single from single.__cause__
    finally:
        if pipeline.recorder is not None:
            pipeline.recorder.close()
