"""Which stages may still hold a request once the terminals it waited for have answered.

When a request completes, the coordinator tells every stage that may still hold state for
it to let go (an ``Abort``, answered by ``Released``), and keeps the id until each has: a
side stage still working, a stage that got a stream the route then took elsewhere.  Asking
every stage would cost two messages a stage a request; :class:`Lingering` names only those
that may hold something, from the graph and the routes the request took, so a request
whose every stage is bound to have finished (a chain, a fan-out that joins again) costs
nothing more.

A stage is **settled** by a terminal that answered when it cannot hold the request any
more: the terminal itself; a stage on every payload path to it (a dominator: the terminal
got its payload, so this stage produced its result); a stage without a ``route_fn`` one
of whose ``next`` stages is settled, or a routing stage all of whose ``next`` stages are
(if it got a payload, what it sends is waited for before that stage finishes).  A stage a
stream reaches without a ``next`` edge is never settled: its chunks may come without a
payload.

What may still hold the request (:meth:`Lingering.after`): every stage neither settled nor
cut off by the routes (:mod:`omnitrio.reach`); a cut-off stage only when a stream may
have reached it — from a stage still reachable that streams to it without a ``next`` edge,
from such a stage in turn, or from a routing stage that streamed to it (or ended its stream
there) and then left it out while another stage could still send it its payload (that
stage reports it, ``streamed``).  A routing stage lets go itself of a stream it sent to a
stage its route cut off.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from omnitrio.config import PipelineConfig
from omnitrio.reach import Reach, Skips

CACHED = 4096
"""Most distinct ``(answered, skips, streamed)`` whose answer :meth:`Lingering.after` keeps."""


@attrs.frozen
class Lingering:
    """See the module docstring."""

    reach: Reach
    stages: frozenset[str]
    settled: dict[str, frozenset[str]]
    """Per terminal stage, the stages that hold nothing of a request once it answered."""
    edges: dict[str, frozenset[str]]
    """Per stage, every stage it sends or streams to."""
    streams_only: dict[str, frozenset[str]]
    """Per stage, the stages it streams to without a ``next`` edge."""
    _known: dict[tuple[frozenset[str], Skips, frozenset[str]], frozenset[str]] = attrs.field(
        factory=dict, init=False, repr=False, eq=False
    )

    @classmethod
    def of(cls, config: PipelineConfig, reach: Reach) -> Lingering:
        """From a validated config and its :class:`Reach`."""
        stages = {s.name: s for s in config.stages}
        streams_only = {s.name: frozenset(s.stream_to) - frozenset(s.next_stages) for s in config.stages}
        loose = frozenset().union(*streams_only.values())
        dominators = _dominators(reach.entry, stages, reach.senders)
        settled: dict[str, frozenset[str]] = {}
        for terminal in (s.name for s in config.stages if s.terminal):
            done = {terminal, *dominators[terminal]}
            changed = True
            while changed:
                changed = False
                for s in config.stages:
                    nexts = s.next_stages
                    if s.name in done or not nexts:
                        continue
                    if all(t in done for t in nexts) if s.route_fn else any(t in done for t in nexts):
                        done.add(s.name)
                        changed = True
            settled[terminal] = frozenset(done) - loose
        return cls(
            reach=reach,
            stages=frozenset(stages),
            settled=settled,
            edges={s.name: frozenset([*s.next_stages, *s.stream_to]) for s in config.stages},
            streams_only=streams_only,
        )

    def after(self, answered: frozenset[str], skips: Skips, streamed: frozenset[str] = frozenset()) -> frozenset[str]:
        """The stages that may still hold a request once ``answered`` (terminal stages) did, given
        the routes it took (``skips``) and the stages routes left out after streaming to them
        (``streamed``).  Worked out once per distinct argument."""
        key = (answered, skips, streamed)
        found = self._known.get(key)
        if found is None:
            found = self._work_out(answered, skips, streamed)
            if len(self._known) < CACHED:
                self._known[key] = found
        return found

    def _work_out(self, answered: frozenset[str], skips: Skips, streamed: frozenset[str]) -> frozenset[str]:
        cut = self.reach.cut_off(skips)
        settled = frozenset().union(*(self.settled[t] for t in answered if t in self.settled))
        touched = set(streamed)
        frontier = [t for s in self.stages - cut for t in self.streams_only[s] if t in cut]
        frontier += [t for t in streamed if t in cut]
        while frontier:  # a cut-off stage a stream reached may stream on, from its chunks alone
            stage = frontier.pop()
            touched.add(stage)
            frontier += [t for t in self.edges[stage] if t in cut and t not in touched]
        return frozenset((self.stages - settled - cut) | touched)


def _dominators(entry: str, stages: Iterable[str], senders: dict[str, tuple[str, ...]]) -> dict[str, frozenset[str]]:
    """Per stage, the stages on every ``next`` path from ``entry`` to it (itself included); a stage
    no path reaches has only itself."""
    names = list(stages)
    every = frozenset(names)
    dom = {name: every for name in names}
    dom[entry] = frozenset((entry,))
    changed = True
    while changed:
        changed = False
        for name in names:
            if name == entry:
                continue
            preds = [dom[s] for s in senders[name]]
            found = frozenset((name,)) | (frozenset.intersection(*preds) if preds else frozenset())
            if found != dom[name]:
                dom[name] = found
                changed = True
    return dom
