"""Per-request input aggregation at a stage (``wait_for`` + ``merge_fn`` + ``wait_for_fn``).

A :class:`FanIn` belongs to one request's scope at one stage and dies with it, so
half-collected inputs are released on every exit — result, failure, abort, shutdown —
without anyone clearing a table.  Arrival order across sources is not fixed: the merge
function receives ``{source: payload}`` and must pick by name.
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

    def add(self, source: str, payload: Any) -> tuple[bool, Any]:
        """Record ``payload`` from ``source``; return ``(True, merged)`` once all are in.

        Raises :class:`FanInError` for a source outside this request's expected set or a
        repeated one, and :class:`StageFunctionError` when user code fails.
        """
        plan = self.plan
        if source not in plan.wait_for:
            raise FanInError(f"stage {plan.name!r} got a payload from {source!r}, which is not in wait_for")
        if self.expected is None:
            self.expected = plan.expected_sources(self.request_id, source, payload)
        if source not in self.expected:
            raise FanInError(
                f"stage {plan.name!r} got a payload from {source!r}, but this request waits for {sorted(self.expected)}"
            )
        if source in self.inputs:
            raise FanInError(f"stage {plan.name!r} got a second payload from {source!r}")
        self.inputs[source] = payload
        if self.inputs.keys() != self.expected:
            return False, None
        inputs, self.inputs = self.inputs, {}
        return True, plan.merge_inputs(inputs)


__all__ = ["FanIn", "FanInError", "StageFunctionError"]
