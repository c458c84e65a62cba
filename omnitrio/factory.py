"""Building a process's stages and their schedulers from the factories the config names.

The caller's process and every stage process build and start their stages here, so both
fail the same way: a factory that raises, or returns
something that is not a scheduler, stops start-up with a :class:`StartupError` naming the
stage and its ``factory_path``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import trio

from omnitrio.config import PipelineConfig
from omnitrio.errors import StartupError
from omnitrio.events import EventRecorder
from omnitrio.importing import import_object
from omnitrio.stage import Stage
from omnitrio.switchboard import Switchboard
from omnitrio.topology import StagePlan

REQUIRED = ("inbox", "outbox", "start", "stop", "abort")
"""What a stage uses of every scheduler (see :class:`omnitrio.contract.StageScheduler`)."""


def scheduler_builder(config: PipelineConfig, stage_name: str) -> Callable[[], Any]:
    """A zero-argument callable that builds the named stage's scheduler and checks its contract."""
    stage = config.stage(stage_name)
    path = stage.factory_path
    factory = import_object(path)
    kwargs = stage.factory.to_kwargs()

    def build() -> Any:
        try:
            scheduler = factory(**kwargs)
        except Exception as exc:
            raise StartupError(f"stage {stage_name!r}: factory {path} raised {exc!r}") from exc
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
        name: Stage(plan, scheduler_builder(config, name), board, recorder, **options) for name, plan in plans.items()
    }
    board.attach(stages)
    return stages


async def start_stages(nursery: trio.Nursery, stages: Iterable[Stage]) -> None:
    """Run every stage in ``nursery``, all starting at once; return when each has warmed up.

    A stage that fails to start raises here (its factory's error, see :func:`scheduler_builder`).
    """
    async with trio.open_nursery() as starting:
        for stage in stages:
            starting.start_soon(nursery.start, stage.run)
