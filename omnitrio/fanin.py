"""Per-request input aggregation at a stage (``wait_for`` + ``merge_fn`` + ``wait_for_fn``).

A :class:`FanIn` belongs to one request's scope at one stage and dies with it, so
half-collected inputs are released on every exit — result, failure, abort, shutdown —
without anyone clearing a table.  Arrival order across sources is not fixed: the merge
function receives ``{source: payload}`` and must pick by name.

A fan-in waits only for the sources that can still arrive: the coordinator tells it
(:meth:`FanIn.cut`, before or after any payload) of sources the request's routes cut off,
and the merge gets the others alone.  A merge that raises then names the routing stage too.
"""

from __future__ import annotations

from typing import Any

import attrs

from omnitrio.topology import StageFunctionError, StagePlan


class FanInError(Exception):
    """Inputs that cannot be merged for this request (wrong or repeated source)."""


@attrs.define
class FanIn:
    """Collects one payload per expected source, then merges them once."""

    plan: StagePlan
    request_id: str
    inputs: dict[str, Any] = attrs.field(factory=dict)
    expected: frozenset[str] | None = None
    cut_off: frozenset[str] = frozenset()
    """Sources the request's routes cut off: never waited for."""
    cut_by: str = ""
    """The routing stage whose route cut the last of them off."""
    done: bool = False

    def add(self, source: str, payload: Any) -> tuple[bool, Any]:
        """Record ``payload`` from ``source``; return ``(True, merged)`` once all are in.

        Raises :class:`FanInError` for a source outside this request's expected set or a
        repeated one, and :class:`StageFunctionError` when user code fails.
        """
        plan = self.plan
        if source not in plan.wait_for:
            raise FanInError(f"stage {plan.name!r} got a payload from {source!r}, which is not in wait_for")
        if self.expected is None:
            self.expected = plan.expected_sources(self.request_id, source, payload) - self.cut_off
        if source not in self.expected:
            raise FanInError(
                f"stage {plan.name!r} got a payload from {source!r}, but this request waits for {sorted(self.expected)}"
            )
        if source in self.inputs:
            raise FanInError(f"stage {plan.name!r} got a second payload from {source!r}")
        self.inputs[source] = payload
        return self._merged()

    def cut(self, sources: frozenset[str], by: str) -> tuple[bool, Any]:
        """``by``'s route cut ``sources`` off: stop waiting for them; ``(True, merged)`` when
        that leaves nothing missing (the same raises as :meth:`add`'s merge)."""
        if not (sources - self.cut_off):
            return False, None
        self.cut_off |= sources
        self.cut_by = by
        if self.expected is None:
            return False, None
        self.expected -= sources
        return self._merged()

    def _merged(self) -> tuple[bool, Any]:
        if self.done or self.expected is None or self.inputs.keys() != self.expected:
            return False, None
        self.done = True
        inputs, self.inputs = self.inputs, {}
        try:
            return True, self.plan.merge_inputs(inputs)
        except StageFunctionError as exc:
            missing = sorted(self.cut_off & self.plan.wait_for)
            if not missing:
                raise
            why = f"stage {self.cut_by!r} routed this request away from {missing}"
            message = str(exc).removeprefix(f"{exc.function}: ")
            raise StageFunctionError(exc.function, exc.error_type, f"{message} ({why})") from exc


__all__ = ["FanIn", "FanInError", "StageFunctionError"]
