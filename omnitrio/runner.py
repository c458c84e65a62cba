"""``open_pipeline``: start a pipeline, hand the caller its API, stop everything on exit.

One start-up path whatever the placement: validate and compile the config; one
:class:`~omnitrio.switchboard.Switchboard` for this process, with the coordinator and
this process's stages; and a stage process per distinct ``process`` name
(:mod:`omnitrio.children`; ``replicas`` of them for a replicated group) — none with
``inline=True`` or when no stage names one.
Stages here and stage processes start in parallel.  Leaving the ``async with`` block
stops every stage and process and removes the pipeline's sockets and shared memory,
whatever the exit; an error raised inside reaches the caller as itself, not wrapped in
an exception group.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from omnitrio.children import open_children
from omnitrio.config import PipelineConfig, validate
from omnitrio.coordinator import Coordinator
from omnitrio.errors import collapse
from omnitrio.events import PIPELINE_READY, flush_periodically, recorder_from_env
from omnitrio.factory import build_stages, start_stages
from omnitrio.pipeline import Pipeline
from omnitrio.replicas import Replicas
from omnitrio.switchboard import Switchboard
from omnitrio.topology import MAIN, Topology


@asynccontextmanager
async def open_pipeline(config: PipelineConfig, *, inline: bool = False) -> AsyncIterator[Pipeline]:
    """Start ``config``'s stages, yield the :class:`Pipeline`, stop everything on exit.

    Raises :class:`omnitrio.ConfigError` before anything starts when the config is invalid (the
    factory of a stage in a process of its own is checked in that process, before it is ready),
    and :class:`omnitrio.errors.StartupError` naming the stage when one cannot start.
    """
    validate(config, process_factories=inline)
    topology = Topology.compile(config)
    homes = topology.homes(inline)
    replicas = Replicas.of(config.processes, homes)
    board, coordinator = Switchboard.for_caller(
        MAIN, homes, replicas, lambda send: Coordinator(topology, send, topology.plans, replicas)
    )
    recorder = recorder_from_env(MAIN)
    here = {name: plan for name, plan in topology.plans.items() if homes[name] == MAIN}
    stages = build_stages(here, config, board, recorder)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(board.run)
            if recorder is not None:
                nursery.start_soon(flush_periodically, recorder)
            async with open_children(config, homes, board, coordinator, recorder) as children:
                try:
                    async with trio.open_nursery() as starting:
                        starting.start_soon(start_stages, nursery, stages.values())
                        starting.start_soon(children.wait_ready)
                    if recorder is not None:
                        recorder.emit(None, None, PIPELINE_READY)
                    yield Pipeline(config, coordinator, stages, children, recorder)
                finally:
                    coordinator.close()
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        single = collapse(group)
        if single is group:
            raise
        raise single from single.__cause__
    finally:
        board.close()
        if recorder is not None:
            recorder.close()
