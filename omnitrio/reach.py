"""Which stages a request can still reach after the routes it took.

A request runs each stage at most once (a stage refuses a second payload), and ``next``
edges form no cycle, so which stages a request can still reach follows from the routes
already taken.  A stage that some stage sends payloads to (by ``next``) runs a request
only once its payload arrives: stream chunks alone never complete it.  Such a stage is
**cut off** for a request when every stage that sends to it is either cut off itself or
routed this request elsewhere (its ``route_fn`` left it out).  A stage only streams
reach (``stream_to``, no ``next`` edge to it) is cut off when every stage streaming to it
is.  The entry stage, and a stage nothing sends or streams to (one a scheduler admits by
itself), are never cut off.  A routing stage sends neither its end of stream nor its
result to a stage its route alone cuts off, and lets go of any stream it had sent there
(:meth:`RouteSkips.choice`), so nothing is held where the route did not go; a stage it
left out that another stage may still send a payload to gets the end of its stream.

A stage with a ``route_fn`` reports what its route left out (:attr:`RouteChoice.reported`)
only when that can matter: when a terminal the left-out targets reach is not one the
chosen targets reach for sure (whatever later routes pick; past a fan-in stage nothing
is sure), or when they lead to a fan-in source.  A route that keeps every terminal and
every fan-in source reachable therefore sends nothing, and whether to report is a lookup;
an unreported skip never keeps a cut-off terminal waited for, since every terminal it
leads to is reached anyway.  The coordinator works out the cut-off stages once per
distinct set of reports (:meth:`Reach.cut_off`), and tells each fan-in stage which of its
sources were cut off (:meth:`Reach.fan_in_cuts`): a fan-in waits only for the sources that
can still arrive.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import attrs

from omnitrio.config import PipelineConfig

Skips = tuple[tuple[str, tuple[str, ...]], ...]
"""What routes left out so far for one request: ``(stage, targets)`` pairs, in arrival order."""
FanInCuts = tuple[tuple[str, frozenset[str]], ...]
"""``(fan-in stage, its cut-off sources)`` pairs, for the fan-in stages not cut off themselves."""
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
    downstream: dict[str, frozenset[str]]
    """Per stage, the stages its ``next`` edges lead to, itself included."""
    fan_ins: dict[str, frozenset[str]]
    """Per fan-in stage (``wait_for``), its sources."""
    _cut_off: dict[Skips, tuple[frozenset[str], FanInCuts]] = attrs.field(
        factory=dict, init=False, repr=False, eq=False
    )

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
        downstream = {s.name: frozenset((s.name,)) for s in stages}
        changed = True
        while changed:  # each pass only grows the sets, which are bounded: it ends
            changed = False
            for s in stages:
                found = reach[s.name].union(*(reach[t] for t in [*s.next_stages, *s.stream_to]))
                below = downstream[s.name].union(*(downstream[t] for t in s.next_stages))
                certain = sure[s.name]
                if s.route_fn and not s.terminal:  # whichever targets it picks, it picks one
                    certain = frozenset.intersection(*(sure[t] for t in s.next_stages))
                elif not (s.terminal or s.wait_for):
                    certain = certain.union(*(sure[t] for t in s.next_stages))
                if found != reach[s.name] or certain != sure[s.name] or below != downstream[s.name]:
                    reach[s.name], sure[s.name], downstream[s.name] = found, certain, below
                    changed = True
        assert config.entry_stage is not None
        return cls(
            entry=config.entry_stage,
            senders={k: tuple(v) for k, v in senders.items()},
            streamers={k: tuple(v) for k, v in streamers.items()},
            reach=reach,
            sure=sure,
            downstream=downstream,
            fan_ins={s.name: frozenset(s.wait_for) for s in stages if s.wait_for},
        )

    @property
    def sources(self) -> frozenset[str]:
        """Every stage some fan-in waits for."""
        return frozenset().union(*self.fan_ins.values())

    def route_skips(self, stage: str, next_stages: tuple[str, ...], stream_to: tuple[str, ...]) -> RouteSkips:
        return RouteSkips(self, stage, next_stages, stream_to)

    def cut_off(self, skips: Skips) -> frozenset[str]:
        """The stages a request can no longer reach, given what routing stages left out: ``skips``
        holds ``(stage, left_out)`` in arrival order.  Worked out once per ``skips`` seen."""
        return self._known(skips)[0]

    def fan_in_cuts(self, skips: Skips) -> FanInCuts:
        """Per fan-in stage still reachable, the sources of it that ``skips`` cut off (those with any)."""
        return self._known(skips)[1]

    def _known(self, skips: Skips) -> tuple[frozenset[str], FanInCuts]:
        found = self._cut_off.get(skips)
        if found is None:
            dead = self._work_out(dict(skips))
            cuts = tuple(
                (stage, sources & dead)
                for stage, sources in self.fan_ins.items()
                if stage not in dead and not sources.isdisjoint(dead)
            )
            found = (dead, cuts)
            if len(self._cut_off) < CACHED:
                self._cut_off[skips] = found
        return found

    def _work_out(self, skips: Mapping[str, Collection[str]]) -> frozenset[str]:
        dead: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, senders in self.senders.items():
                if name in dead or name == self.entry:
                    continue
                if senders:
                    gone = all(s in dead or name in skips.get(s, ()) for s in senders)
                else:
                    streamers = self.streamers[name]
                    gone = bool(streamers) and all(s in dead for s in streamers)
                if gone:
                    dead.add(name)
                    changed = True
        return frozenset(dead)


@attrs.frozen
class RouteChoice:
    """What follows from one choice of a routing stage (:meth:`RouteSkips.choice`)."""

    reported: tuple[str, ...]
    """The targets left out, when the coordinator must hear of them; else ()."""
    done_to: tuple[str, ...]
    """The ``stream_to`` stages that get the end of its stream: those the choice does not cut off
    (those chosen, and those another stage may still send a payload to)."""
    cut: frozenset[str]
    """The stages this choice alone cuts off: a stream sent there is let go of."""


class RouteSkips:
    """What one routing stage's choices mean; a lookup once a choice has been seen."""

    __slots__ = ("_known", "_name", "_next", "_reach", "_stream_to")

    def __init__(self, reach: Reach, name: str, next_stages: tuple[str, ...], stream_to: tuple[str, ...]) -> None:
        self._reach = reach
        self._name = name
        self._next = next_stages
        self._stream_to = stream_to
        self._known: dict[str | frozenset[str], RouteChoice] = {}

    def choice(self, targets: list[str]) -> RouteChoice:
        """What a route to ``targets`` (a non-empty subset of ``next``) means for the request."""
        key: str | frozenset[str] = targets[0] if len(targets) == 1 else frozenset(targets)
        found = self._known.get(key)
        if found is None:
            found = self._known[key] = self._work_out(targets)
        return found

    def reported(self, targets: list[str]) -> tuple[str, ...]:
        """The targets a route to ``targets`` left out, when the coordinator must hear of them; else ()."""
        return self.choice(targets).reported

    def _work_out(self, targets: list[str]) -> RouteChoice:
        reach = self._reach
        left_out = tuple(t for t in self._next if t not in targets)
        if not left_out:
            return RouteChoice((), self._stream_to, frozenset())
        at_risk = frozenset().union(*(reach.reach[t] for t in left_out))
        certain = frozenset().union(*(reach.sure[t] for t in targets))
        feeds_fan_in = not reach.sources.isdisjoint(frozenset().union(*(reach.downstream[t] for t in left_out)))
        cut = reach.cut_off(((self._name, left_out),))
        done_to = tuple(t for t in self._stream_to if t not in cut)
        return RouteChoice(left_out if at_risk - certain or feeds_fan_in else (), done_to, cut)
