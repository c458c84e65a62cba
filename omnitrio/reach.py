"""Which terminal stages a request can still reach after the routes it took.

A request runs each stage at most once (a stage refuses a second payload), and ``next``
edges form no cycle, so which stages a request can still reach follows from the routes
already taken.  A stage is **cut off** for a request when it is not the entry stage, some
stage sends to it, and every stage that does (by ``next`` or ``stream_to``) is either cut
off itself or routed this request elsewhere (its ``route_fn`` left it out).  A stream
sender that runs never cuts a stage off: its chunks do not follow the route.  A stage no
stage sends to (one a scheduler admits by itself) is never cut off.

A stage with a ``route_fn`` reports what its route left out (:meth:`RouteSkips.reported`)
only when that can matter: when a terminal the left-out targets reach is not one the
chosen targets reach for sure (whatever later routes pick; past a fan-in stage nothing
is sure).  A route that keeps every terminal reachable therefore sends nothing, and
whether to report is a lookup; an unreported skip never keeps a cut-off terminal waited
for, since every terminal it leads to is reached anyway.  The coordinator works out the
cut-off stages once per distinct set of reports (:meth:`Reach.cut_off`).

What this does not see: a fan-in stage (``wait_for``) one of whose sources was routed
elsewhere still counts as reachable while another source sends to it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import attrs

from omnitrio.config import PipelineConfig

Skips = tuple[tuple[str, tuple[str, ...]], ...]
"""What routes left out so far for one request: ``(stage, targets)`` pairs, in arrival order."""
CACHED = 4096
"""Most ``Skips`` whose cut-off stages :meth:`Reach.cut_off` keeps (a graph has few)."""


@attrs.frozen
class Reach:
    """The pipeline's graph as reachability: see the module docstring."""

    entry: str
    senders: dict[str, tuple[str, ...]]
    """Per stage, the stages whose ``next`` holds it."""
    streamers: dict[str, tuple[str, ...]]
    """Per stage, the stages whose ``stream_to`` holds it."""
    reach: dict[str, frozenset[str]]
    """Per stage, the terminal stages some path from it leads to (itself, if terminal)."""
    sure: dict[str, frozenset[str]]
    """Per stage, the terminal stages a request that runs it reaches whatever any route decides."""
    _cut_off: dict[Skips, frozenset[str]] = attrs.field(factory=dict, init=False, repr=False, eq=False)

    @classmethod
    def of(cls, config: PipelineConfig) -> Reach:
        """From a validated config."""
        stages = config.stages
        senders: dict[str, list[str]] = {s.name: [] for s in stages}
        streamers: dict[str, list[str]] = {s.name: [] for s in stages}
        for s in stages:
            for target in s.next_stages:
                senders[target].append(s.name)
            for target in s.stream_to:
                streamers[target].append(s.name)
        reach = {s.name: frozenset((s.name,)) if s.terminal else frozenset() for s in stages}
        sure = dict(reach)
        changed = True
        while changed:  # each pass only grows the sets, which are bounded: it ends
            changed = False
            for s in stages:
                found = reach[s.name].union(*(reach[t] for t in [*s.next_stages, *s.stream_to]))
                certain = sure[s.name]
                if s.route_fn and not s.terminal:  # whichever targets it picks, it picks one
                    certain = frozenset.intersection(*(sure[t] for t in s.next_stages))
                elif not (s.terminal or s.wait_for):
                    certain = certain.union(*(sure[t] for t in s.next_stages))
                if found != reach[s.name] or certain != sure[s.name]:
                    reach[s.name], sure[s.name] = found, certain
                    changed = True
        assert config.entry_stage is not None
        return cls(
            entry=config.entry_stage,
            senders={k: tuple(v) for k, v in senders.items()},
            streamers={k: tuple(v) for k, v in streamers.items()},
            reach=reach,
            sure=sure,
        )

    def skippable(self, next_stages: Collection[str]) -> frozenset[str]:
        """The terminals some one-target route over ``next_stages`` leaves unreachable from there."""
        every = frozenset().union(*(self.reach[t] for t in next_stages))
        return frozenset().union(*(every - self.reach[t] for t in next_stages))

    def route_skips(self, next_stages: tuple[str, ...]) -> RouteSkips:
        return RouteSkips(self, next_stages)

    def cut_off(self, skips: Skips) -> frozenset[str]:
        """The stages a request can no longer reach, given what routing stages left out: ``skips``
        holds ``(stage, left_out)`` in arrival order.  Worked out once per ``skips`` seen."""
        found = self._cut_off.get(skips)
        if found is None:
            found = self._work_out(dict(skips))
            if len(self._cut_off) < CACHED:
                self._cut_off[skips] = found
        return found

    def _work_out(self, skips: Mapping[str, Collection[str]]) -> frozenset[str]:
        dead: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, senders in self.senders.items():
                if name in dead or name == self.entry or not (senders or self.streamers[name]):
                    continue
                if all(s in dead or name in skips.get(s, ()) for s in senders) and all(
                    s in dead for s in self.streamers[name]
                ):
                    dead.add(name)
                    changed = True
        return frozenset(dead)


class RouteSkips:
    """What one routing stage reports of its routes; a lookup once a choice has been seen."""

    __slots__ = ("_known", "_next", "_reach")

    def __init__(self, reach: Reach, next_stages: tuple[str, ...]) -> None:
        self._reach = reach
        self._next = next_stages
        self._known: dict[str | frozenset[str], tuple[str, ...]] = {}

    def reported(self, targets: list[str]) -> tuple[str, ...]:
        """The targets a route to ``targets`` left out, when the coordinator must hear of them; else ()."""
        if len(targets) == len(self._next):
            return ()
        key: str | frozenset[str] = targets[0] if len(targets) == 1 else frozenset(targets)
        found = self._known.get(key)
        if found is None:
            found = self._known[key] = self._work_out(targets)
        return found

    def _work_out(self, targets: list[str]) -> tuple[str, ...]:
        reach = self._reach
        left_out = tuple(t for t in self._next if t not in targets)
        at_risk = frozenset().union(*(reach.reach[t] for t in left_out))
        certain = frozenset().union(*(reach.sure[t] for t in targets))
        return left_out if at_risk - certain else ()


def route_warnings(config: PipelineConfig) -> list[str]:
    """One line per ``route_fn`` that can leave a terminal stage out while no ``terminal_stages_fn``
    says which terminals each request waits for (``omnitrio check`` prints them)."""
    if config.terminal_stages_fn is not None:
        return []
    reach = Reach.of(config)
    return [
        f"stage {stage.name!r}: its route_fn can leave out terminal stage(s) {sorted(skippable)} and no "
        "terminal_stages_fn says which terminals a request waits for; a request routed away from one "
        "completes with the terminals that answered"
        for stage in config.stages
        if stage.route_fn and not stage.terminal and (skippable := reach.skippable(stage.next_stages))
    ]
