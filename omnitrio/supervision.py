"""Scheduler supervision: build a stage's scheduler, run it, rebuild it when it crashes, or give up.

:class:`SchedulerSupervisor` owns one stage's scheduler lives, one
:class:`~omnitrio.bridge.SchedulerBridge` each, all feeding from one
:class:`~omnitrio.inbox_feed.InboxFeed` (so what arrives while a scheduler is being rebuilt
waits there and reaches the next one).

* The first build runs in a worker thread (loading models takes seconds; the IO loop
  keeps serving).  A factory that raises, or a scheduler whose warm-up raises or outlasts
  the stage's ``warm_up_timeout``, fails the stage's start: :meth:`run` raises
  :class:`StartupError` naming the stage before reporting started.
* When a scheduler crashes (``start()`` raised or returned by itself), the stage is told
  at once (``on_crash``: it fails the requests the scheduler held), and the supervisor
  waits ``scheduler_restart_backoff`` seconds — doubled after every restart in a row
  that crashed again before delivering anything, at most :data:`MAX_BACKOFF_S` — then
  builds a fresh scheduler (in a worker thread) and runs it.
* A rebuild that fails (the factory raises, warm-up raises or outlasts its deadline, or
  ``start()`` raises before the scheduler delivered anything) counts as one more restart.  Past
  ``scheduler_restarts`` restarts the stage is dead: ``on_dead`` is told why, once, and
  the supervisor returns; the stage fails its requests from then on, and the rest of the
  pipeline keeps serving.

Cancellation stops the running scheduler (see the bridge) and ends the supervisor at once,
also while a factory is still building (its thread is left to finish on its own).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import Any

import attrs
import trio

from omnitrio.bridge import Outcome, Run, SchedulerBridge
from omnitrio.config import StageConfig
from omnitrio.errors import StartupError
from omnitrio.inbox_feed import InboxFeed

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0
"""The longest wait before a rebuild, however many crashed in a row."""


class StageDead(RuntimeError):
    """A request reached (or was held by) a stage whose scheduler could not be rebuilt."""


class SchedulerState(enum.Enum):
    """Whether a stage's scheduler can serve."""

    STARTING = "starting"
    SERVING = "serving"
    RESTARTING = "restarting"
    DEAD = "dead"


@attrs.frozen
class RestartPolicy:
    """How long a scheduler may warm up, and how often and how patiently a crashed one is rebuilt
    (from :class:`StageConfig`)."""

    restarts: int = 5
    backoff_s: float = 0.05
    warm_up_timeout: float = 600.0

    @classmethod
    def of(cls, config: StageConfig) -> RestartPolicy:
        return cls(config.scheduler_restarts, config.scheduler_restart_backoff, config.warm_up_timeout)

    def delay(self, crashed_in_a_row: int) -> float:
        """Seconds to wait before a rebuild after ``crashed_in_a_row`` (≥ 1) lives that ended so."""
        return min(self.backoff_s * 2 ** (crashed_in_a_row - 1), MAX_BACKOFF_S)


MakeBridge = Callable[[Any, InboxFeed], SchedulerBridge]


class SchedulerSupervisor:
    """One stage's scheduler lives; see the module docstring."""

    def __init__(
        self,
        name: str,
        build: Callable[[], Any],
        policy: RestartPolicy,
        make_bridge: MakeBridge,
        feed: InboxFeed,
        *,
        on_crash: Callable[[BaseException], None],
        on_dead: Callable[[str], None],
    ) -> None:
        """``make_bridge(scheduler, feed)`` makes (and installs at the stage) each life's bridge."""
        self.name = name
        self._build = build
        self.policy = policy
        self._make_bridge = make_bridge
        self.feed = feed
        self._on_crash = on_crash
        self._on_dead = on_dead
        self.state = SchedulerState.STARTING
        self.restarts = 0
        """Schedulers built after the first (successful or not)."""
        self.dead_reason: str | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled or dead; ``started`` once the first scheduler has warmed up."""
        # StartupError: the stage cannot start
        scheduler = await trio.to_thread.run_sync(self._build, abandon_on_cancel=True)
        bridge = self._make_bridge(scheduler, self.feed)
        outcome = await self._first_life(bridge, task_status)
        delivered = bridge.outbox.delivered
        crashed_in_a_row = 0
        while True:
            crashed_in_a_row = 1 if delivered else crashed_in_a_row + 1
            error = outcome.error or RuntimeError(f"scheduler of stage {self.name!r} {outcome.run.value}")
            self.state = SchedulerState.RESTARTING
            log.error("stage %r: scheduler %s, restarting it: %r", self.name, outcome.run.value, error)
            self._on_crash(error)
            if self.restarts >= self.policy.restarts:
                self._die(f"its scheduler {outcome.run.value} ({type(error).__name__}: {error})")
                return
            await trio.sleep(self.policy.delay(crashed_in_a_row))
            self.restarts += 1
            try:
                scheduler = await trio.to_thread.run_sync(self._build, abandon_on_cancel=True)
            except StartupError as exc:
                outcome, delivered = Outcome(Run.FAILED_TO_START, exc), False
                continue
            bridge = self._make_bridge(scheduler, self.feed)
            outcome = await self._life(bridge)
            delivered = bridge.outbox.delivered

    async def _first_life(self, bridge: SchedulerBridge, task_status: trio.TaskStatus[None]) -> Outcome:
        outcome = await self._life(bridge, task_status.started)
        if outcome.run is Run.FAILED_TO_START:
            assert outcome.error is not None
            raise outcome.error
        return outcome

    async def _life(self, bridge: SchedulerBridge, started: Callable[[], object] = lambda: None) -> Outcome:
        """Run one scheduler until it crashes (``started()`` once it has warmed up), or until its
        warm-up outlasts ``warm_up_timeout`` (then it is stopped, and failed to start)."""
        ended: list[Outcome] = []

        async def life(*, task_status: trio.TaskStatus[Run]) -> None:
            ended.append(await bridge.run(task_status=task_status))

        async with trio.open_nursery() as nursery:
            with trio.move_on_after(self.policy.warm_up_timeout):
                if await nursery.start(life) is not Run.FAILED_TO_START:
                    self.state = SchedulerState.SERVING
                    started()
        if not ended:
            seconds = self.policy.warm_up_timeout
            error = StartupError(
                f"stage {self.name!r}: its scheduler did not warm up within {seconds:g} s (warm_up_timeout)"
            )
            return Outcome(Run.FAILED_TO_START, error)
        return ended[0]

    def _die(self, why: str) -> None:
        self.state = SchedulerState.DEAD
        self.dead_reason = (
            f"stage {self.name!r} is dead: {why}; gave up after {self.restarts} restart(s) (scheduler_restarts)"
        )
        log.error("%s", self.dead_reason)
        self.feed.clear()
        self._on_dead(self.dead_reason)
