"""``Pipeline.health()``'s stage entries: made here, for stages in this process and in stage processes.

Every stage has one entry ``{"alive", "pid", "process", "active_requests", "restarts",
"dead"}``: ``alive`` is False for a stage whose process is down or did not answer, and for
a dead stage (its scheduler could not be rebuilt), whose ``dead`` then says why (None
otherwise).  ``restarts`` counts its process's restarts plus its scheduler's.  A stage of
a replicated process group also has ``replicas``: each copy's own entry, in replica order;
its ``alive`` is True only when every copy is alive, its counts are summed, ``dead`` is the
first copy's reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs


class StageFigures(Protocol):
    """What a stage says of itself (:class:`omnitrio.stage.Stage`)."""

    @property
    def active_requests(self) -> int: ...

    @property
    def restarts(self) -> int: ...

    @property
    def queue_depth(self) -> int: ...

    @property
    def dead(self) -> str | None: ...


@attrs.frozen
class Figures:
    """One stage's figures as a stage process reports them (``wire.HealthReply``)."""

    active_requests: int = 0
    restarts: int = 0
    queue_depth: int = 0
    dead: str | None = None

    @classmethod
    def of(cls, stage: StageFigures) -> Figures:
        return cls(stage.active_requests, stage.restarts, stage.queue_depth, stage.dead)

    def to_wire(self) -> list[int]:
        return [self.active_requests, self.restarts, self.queue_depth]

    @classmethod
    def from_wire(cls, counts: Sequence[int], dead: str | None) -> Figures:
        active, restarts, depth = [*counts, 0, 0, 0][:3]
        return cls(active, restarts, depth, dead)


def stage_entry(alive: bool, pid: int, process: str, figures: Figures, process_restarts: int = 0) -> dict[str, Any]:
    """One stage's entry (see the module docstring)."""
    return {
        "alive": alive and figures.dead is None,
        "pid": pid,
        "process": process,
        "active_requests": figures.active_requests,
        "restarts": process_restarts + figures.restarts,
        "dead": figures.dead,
    }


def replicated_entry(group: str, replicas: list[dict[str, Any]]) -> dict[str, Any]:
    """The entry of a stage in a replicated group (module docstring)."""
    if len(replicas) == 1:
        return replicas[0]
    entry = {
        "alive": all(r["alive"] for r in replicas),
        "pid": replicas[0]["pid"],
        "process": group,
        "active_requests": sum(r["active_requests"] for r in replicas),
        "restarts": sum(r["restarts"] for r in replicas),
        "dead": next((r["dead"] for r in replicas if r["dead"] is not None), None),
    }
    return {**entry, "replicas": replicas}


def gauges(per_process: Mapping[str, Figures]) -> dict[str, Any]:
    """A stage's metrics gauges ``{"active_requests", "queue_depth"}`` from its copies' figures
    (summed, with ``"replicas"``: the same per process, when there are several)."""
    each = {
        name: {"active_requests": f.active_requests, "queue_depth": f.queue_depth} for name, f in per_process.items()
    }
    total = {key: sum(g[key] for g in each.values()) for key in ("active_requests", "queue_depth")}
    return {**total, "replicas": each} if len(each) > 1 else total
