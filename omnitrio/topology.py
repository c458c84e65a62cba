"""The compiled pipeline: per-stage routes, projections, fan-in sources, stream targets, homes.

A :class:`Topology` is built once per process from a validated config; every user
function it names is imported here, once.  Calls into user code (``route_fn``,
projections, ``stream_done_to_fn``) go through :class:`StagePlan`, which turns a raise or
an invalid return into :class:`StageFunctionError` — the caller fails that one request,
never the stage.

Where a stage's end of stream goes is the runtime's decision (:meth:`StagePlan.stream_done_targets`):
only to the ``stream_to`` stages its route chose, or that the route leaves reachable;
``stream_done_to_fn`` overrides it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from omnitrio.config import PipelineConfig, StageConfig
from omnitrio.contract import StagePayload
from omnitrio.importing import import_object
from omnitrio.lingering import Lingering
from omnitrio.reach import Reach, RouteChoice, RouteSkips

MAIN = "main"
"""The caller's process: the coordinator's, and the home of every stage without ``process``."""


class StageFunctionError(Exception):
    """User routing code failed for one request; ``error_type`` names what it raised."""

    def __init__(self, function: str, error_type: str, message: str) -> None:
        super().__init__(f"{function}: {message}")
        self.function = function
        self.error_type = error_type


def call_user(function: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Call user code; any exception becomes a :class:`StageFunctionError` naming ``function``."""
    try:
        return fn(*args)
    except Exception as exc:
        raise StageFunctionError(function, type(exc).__name__, str(exc)) from exc


def _target_list(function: str, value: Any, allowed: tuple[str, ...], allow_empty: bool) -> list[str]:
    targets = [value] if isinstance(value, str) else value
    if value is None and allow_empty:
        return []
    if not isinstance(targets, list | tuple) or not all(isinstance(t, str) for t in targets):
        raise StageFunctionError(function, "TypeError", f"must return a stage name or a list of them, got {value!r}")
    if not targets and not allow_empty:
        raise StageFunctionError(function, "ValueError", f"returned no target; choose from {list(allowed)}")
    unknown = [t for t in targets if t not in allowed]
    if unknown:
        raise StageFunctionError(function, "ValueError", f"returned {unknown}, which is not in {list(allowed)}")
    return list(dict.fromkeys(targets))


def _shares_mutable(a: Any, b: Any) -> bool:
    """True when ``b`` holds a dict/list/set/bytearray that is also inside ``a``."""

    def containers(obj: Any, out: set[int], depth: int = 0) -> set[int]:
        if depth > 50:
            return out
        if isinstance(obj, dict | list | set | bytearray):
            if id(obj) in out:
                return out
            out.add(id(obj))
        if isinstance(obj, dict):
            for v in obj.values():
                containers(v, out, depth + 1)
        elif isinstance(obj, list | tuple | set | frozenset):
            for v in obj:
                containers(v, out, depth + 1)
        return out

    return bool(containers(a, set()) & containers(b, set()))


@attrs.define
class StagePlan:
    """Everything a stage needs to know about where its outputs go."""

    name: str
    config: StageConfig
    next: tuple[str, ...]
    route: Callable[[str, Any], Any] | None
    projections: dict[str, Callable[[StagePayload], StagePayload]]
    wait_for: frozenset[str]
    merge: Callable[[dict[str, StagePayload]], StagePayload] | None
    wait_for_fn: Callable[[str, str, StagePayload], Any] | None
    stream_to: tuple[str, ...]
    stream_done_to: Callable[[str, Any], Any] | None
    skips: RouteSkips | None = None
    """What this stage's route choices mean (with a ``route_fn`` only)."""
    cuttable: bool = False
    """Whether routes can cut off one of this fan-in stage's sources (it may hear so after it ran)."""

    @property
    def terminal(self) -> bool:
        return self.config.terminal

    def targets(self, request_id: str, payload: Any) -> list[str]:
        """Where this request's result goes: a non-empty subset of ``next``."""
        if self.route is None:
            return list(self.next)
        value = call_user(f"route_fn of stage {self.name!r}", self.route, request_id, payload)
        return _target_list(f"route_fn of stage {self.name!r}", value, self.next, allow_empty=False)

    def left_out(self, targets: list[str]) -> tuple[str, ...]:
        """The targets a route to ``targets`` left out, when the coordinator must hear of them
        (:mod:`omnitrio.reach`); else ()."""
        return () if self.skips is None else self.skips.reported(targets)

    def choice(self, targets: list[str]) -> RouteChoice | None:
        """What a route to ``targets`` means (:class:`~omnitrio.reach.RouteChoice`); None without a ``route_fn``."""
        return None if self.skips is None else self.skips.choice(targets)

    def stream_done_targets(self, request_id: str, result: Any, choice: RouteChoice | None) -> Sequence[str]:
        """Which ``stream_to`` stages get this request's end-of-stream signal: those the route
        (``choice``) chose or leaves reachable; all of them without a route; what
        ``stream_done_to_fn`` says when the stage has one."""
        if self.stream_done_to is None:
            return self.stream_to if choice is None else choice.done_to
        where = f"stream_done_to_fn of stage {self.name!r}"
        value = call_user(where, self.stream_done_to, request_id, result)
        return _target_list(where, value, self.stream_to, allow_empty=True)

    def project(self, target: str, payload: Any, *, fan_out: bool) -> Any:
        """What ``target`` receives.

        With a projection, its return value (a copy is made when it shares a mutable
        container with the original, so a target never sees another's edits).  On a
        fan-out without one, a deep copy.  A single target gets the object itself.
        """
        projector = self.projections.get(target)
        if projector is None:
            return copy.deepcopy(payload) if fan_out else payload
        where = f"project_payload[{target!r}] of stage {self.name!r}"
        projected = call_user(where, projector, payload)
        if not isinstance(projected, StagePayload):
            raise StageFunctionError(where, "TypeError", f"must return a StagePayload, got {type(projected).__name__}")
        if projected is payload or _shares_mutable(getattr(payload, "data", None), projected.data):
            projected = copy.deepcopy(projected)
        return projected

    def expected_sources(self, request_id: str, from_stage: str, payload: Any) -> frozenset[str]:
        """The fan-in sources this request waits for, decided on its first arrival."""
        if self.wait_for_fn is None:
            return self.wait_for
        where = f"wait_for_fn of stage {self.name!r}"
        value = call_user(where, self.wait_for_fn, request_id, from_stage, payload)
        return frozenset(_target_list(where, value, tuple(sorted(self.wait_for)), allow_empty=False))

    def merge_inputs(self, inputs: dict[str, Any]) -> Any:
        assert self.merge is not None
        return call_user(f"merge_fn of stage {self.name!r}", self.merge, inputs)


def compile_stage(config: StageConfig) -> StagePlan:
    """Import a stage's functions once; the config must already be validated."""

    def maybe(path: str | None) -> Any:
        return import_object(path) if path else None

    return StagePlan(
        name=config.name,
        config=config,
        next=tuple(config.next_stages),
        route=maybe(config.route_fn),
        projections={t: import_object(p) for t, p in config.project_payload.items()},
        wait_for=frozenset(config.wait_for),
        merge=maybe(config.merge_fn),
        wait_for_fn=maybe(config.wait_for_fn),
        stream_to=tuple(config.stream_to),
        stream_done_to=maybe(config.stream_done_to_fn),
    )


def _routed_away(config: PipelineConfig, reach: Reach) -> frozenset[str]:
    """The stages some route can leave a request without: those below a routing stage's ``next``."""
    return frozenset().union(*(reach.downstream[t] for s in config.stages if s.route_fn for t in s.next_stages))


@attrs.define
class Topology:
    """The whole graph: stage plans by name, process groups, entry and terminals."""

    config: PipelineConfig
    plans: dict[str, StagePlan]
    terminal_stages_fn: Callable[[str, Any], Any] | None
    reach: Reach
    lingering: Lingering

    @classmethod
    def compile(cls, config: PipelineConfig, stage_names: Any = None) -> Topology:
        wanted = set(stage_names) if stage_names is not None else {s.name for s in config.stages}
        plans = {s.name: compile_stage(s) for s in config.stages if s.name in wanted}
        reach = Reach.of(config)
        for plan in plans.values():
            if plan.route is not None:
                plan.skips = reach.route_skips(plan.name, plan.next, plan.stream_to)
            plan.cuttable = plan.name in reach.fan_ins and not reach.fan_ins[plan.name].isdisjoint(
                _routed_away(config, reach)
            )
        fn = import_object(config.terminal_stages_fn) if config.terminal_stages_fn else None
        return cls(
            config=config, plans=plans, terminal_stages_fn=fn, reach=reach, lingering=Lingering.of(config, reach)
        )

    @property
    def entry(self) -> str:
        assert self.config.entry_stage is not None
        return self.config.entry_stage

    @property
    def terminals(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.config.terminal_stages)

    def expected_terminals(self, request_id: str, inputs: Any) -> frozenset[str]:
        """The terminal stages whose results complete this request."""
        if self.terminal_stages_fn is None:
            return frozenset(self.terminals)
        value = call_user("terminal_stages_fn", self.terminal_stages_fn, request_id, inputs)
        return frozenset(_target_list("terminal_stages_fn", value, self.terminals, allow_empty=False))

    def homes(self, inline: bool) -> dict[str, str]:
        """The process of every stage: its ``process`` name, or :data:`MAIN` (the caller's)."""
        return {s.name: MAIN if inline or not s.process else s.process for s in self.config.stages}
