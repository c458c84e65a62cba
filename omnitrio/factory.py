"""Building a process's stages and their schedulers from the factories the config names.

The caller's process and every stage process build and start their stages here, so both
fail the same way: a factory that does not accept its arguments raises the
:class:`~omnitrio.errors.ConfigError` :func:`~omnitrio.config.validate` raises (a caller leaves that
check of a process's stages to the process); a factory that raises, or returns
something that is not a scheduler, stops start-up with a :class:`StartupError` naming the
stage and its ``factory_path``.  With a recorder, each build and each stage's warm-up leave
start-up events (:mod:`omnitrio.events`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import trio

from omnitrio.config import PipelineConfig, check_factory
from omnitrio.errors import StartupError
from omnitrio.events import STAGE_BUILD_BEGAN, STAGE_BUILT, STAGE_WARM, EventRecorder
from omnitrio.importing import import_object
from omnitrio.stage import Stage
from omnitrio.switchboard import Switchboard
from omnitrio.topology import StagePlan

REQUIRED = ("inbox", "outbox", "start", "stop", "abort")
"""What a stage uses of every scheduler (see :class:`omnitrio.contract.StageScheduler`)."""


def scheduler_builder(
    config: PipelineConfig, stage_name: str, recorder: EventRecorder | None = None
) -> Callable[[], Any]:
    """A zero-argument callable that builds the named stage's scheduler and checks its contract.

    Raises :class:`~omnitrio.errors.ConfigError` at once when the factory does not accept its
    arguments (:func:`~omnitrio.config.check_factory`).

    Call it from any thread of a trio run; with ``recorder`` each call leaves ``stage_build_began``
    and ``stage_built`` events, timed where it ran.
    """
    stage = config.stage(stage_name)
    path = stage.factory_path
    factory = import_object(path)  # a module that fails to import here raises with its traceback
    check_factory(config, stage_name)
    kwargs = stage.factory.to_kwargs()
    token = trio.lowlevel.current_trio_token() if recorder is not None else None

    def record(name: str) -> None:
        if recorder is not None and token is not None:
            token.run_sync_soon(recorder.emit_at, time.monotonic_ns(), None, stage_name, name)

    def build() -> Any:
        record(STAGE_BUILD_BEGAN)
        try:
            scheduler = factory(**kwargs)
        except Exception as exc:
            raise StartupError(f"stage {stage_name!r}: factory {path} raised {exc!r}") from exc
        record(STAGE_BUILT)
        missing = [name for name in REQUIRED if not hasattr(scheduler, name)]
        if missing:
            raise StartupError(
                f"stage {stage_name!r}: factory {path} returned a {type(scheduler).__name__}, not a scheduler "
                f"(it has no {', '.join(missing)}; a scheduler needs {', '.join(REQUIRED)})"
            )
        return scheduler

    return build


def build_stages(
    plans: dict[str, StagePlan],
    config: PipelineConfig,
    board: Switchboard,
    recorder: EventRecorder | None,
    **options: Any,
) -> dict[str, Stage]:
    """This process's stages, registered with its switchboard (``options`` go to each :class:`Stage`)."""
    stages = {
        name: Stage(plan, scheduler_builder(config, name, recorder), board, recorder, **options)
        for name, plan in plans.items()
    }
    board.attach(stages)
    return stages


async def start_stages(nursery: trio.Nursery, stages: Iterable[Stage]) -> None:
    """Run every stage in ``nursery``, all starting at once; return when each has warmed up.

    A stage that fails to start raises here (its factory's error, see :func:`scheduler_builder`).
    """
    async with trio.open_nursery() as starting:
        for stage in stages:
            starting.start_soon(_start_stage, nursery, stage)


async def _start_stage(nursery: trio.Nursery, stage: Stage) -> None:
    await nursery.start(stage.run)
    if stage.recorder is not None:
        warmed = [str(path) for path in getattr(stage.scheduler, "warmed", ())]
        stage.recorder.emit(None, stage.name, STAGE_WARM, warmed=warmed)
