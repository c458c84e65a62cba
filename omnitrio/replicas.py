"""Replicated process groups: which copy of each group a request is bound to.

A process group with ``replicas = N`` (``processes.<group>.replicas`` in the config) runs
as N processes named ``<group>.0`` … ``<group>.<N-1>``; a group with one replica keeps
its plain name.  The coordinator binds every request to one replica of each replicated
group when it is submitted (:class:`Bindings`: the least loaded) and the binding holds for the
request's whole life: its payloads, fan-in inputs, stream chunks, credits and aborts all
go to the same copies.

The binding travels inside the request's incarnation number ``inc``, which every
request-level message already carries: ``inc = serial * span + binding`` (a mixed-radix
number with one digit per replicated group).  Any process can therefore route any message
(:meth:`Replicas.process_of`) with no table per request, and incarnations still grow with
the serial, so "an earlier life of this id" compares as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

REPLICAS_KEY = "replicas"
"""The key of ``PipelineConfig.processes[group]`` that sets a group's replica count."""


@attrs.frozen
class Replicas:
    """Where every stage lives, per request: ``homes`` (stage → group) and the replica counts.

    Groups not in ``counts`` have one replica.
    """

    homes: Mapping[str, str]
    counts: Mapping[str, int] = attrs.field(factory=dict)
    _strides: dict[str, int] = attrs.field(init=False)
    _groups: dict[str, tuple[str, int]] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        strides, stride = {}, 1
        for group in sorted(g for g, n in self.counts.items() if n > 1):
            strides[group] = stride
            stride *= self.counts[group]
        object.__setattr__(self, "_strides", strides)
        object.__setattr__(self, "_groups", {self.name(g, i): (g, i) for g in strides for i in range(self.counts[g])})

    @classmethod
    def of(cls, processes: Mapping[str, Mapping[str, float]], homes: Mapping[str, str]) -> Replicas:
        """From a config's ``processes`` table, for the groups that ``homes`` places stages in."""
        used = set(homes.values())
        counts = {g: int(r[REPLICAS_KEY]) for g, r in processes.items() if REPLICAS_KEY in r and g in used}
        return cls(dict(homes), {g: n for g, n in counts.items() if n > 1})

    @property
    def span(self) -> int:
        """How many distinct bindings there are (1 without replicated groups)."""
        span = 1
        for group in self._strides:
            span *= self.counts[group]
        return span

    @property
    def replicated(self) -> tuple[str, ...]:
        """The groups with more than one replica, in binding order."""
        return tuple(self._strides)

    def count(self, group: str) -> int:
        return self.counts.get(group, 1)

    def name(self, group: str, index: int) -> str:
        """The process name of replica ``index`` of ``group`` (the group's own name if it has one replica)."""
        return group if self.count(group) == 1 else f"{group}.{index}"

    def processes(self, group: str) -> list[str]:
        """The process names of every replica of ``group``."""
        return [self.name(group, i) for i in range(self.count(group))]

    def group_of(self, process: str) -> tuple[str, int]:
        """``(group, replica index)`` of a process name."""
        return self._groups.get(process, (process, 0))

    def bind(self, serial: int, choice: Mapping[str, int]) -> int:
        """The incarnation number of the ``serial``-th request bound to ``choice`` (group → replica)."""
        binding = sum(choice.get(group, 0) * stride for group, stride in self._strides.items())
        return serial * self.span + binding

    def replica(self, group: str, inc: int) -> int:
        """Which replica of ``group`` the request of incarnation ``inc`` is bound to (0 if not replicated)."""
        stride = self._strides.get(group)
        return 0 if stride is None else (inc // stride) % self.counts[group]

    def process_of(self, stage: str, inc: int) -> str:
        """The process that holds ``stage`` for the request of incarnation ``inc``."""
        group = self.homes[stage]
        stride = self._strides.get(group)
        return group if stride is None else f"{group}.{(inc // stride) % self.counts[group]}"

    def stages_in(self, group: str, stages: Iterable[str] | None = None) -> list[str]:
        """The stages placed in ``group`` (among ``stages``, default all), in config order."""
        names = self.homes if stages is None else stages
        return [s for s in names if self.homes.get(s) == group]


class Bindings:
    """The coordinator's side: new requests bound to the least-loaded live replicas.

    Load is the number of live requests bound to a replica (from :meth:`open` until
    :meth:`close`); ties go round-robin, so requests that come one at a time spread too.
    A replica that is down (:meth:`gone`, until :meth:`up`) gets no new request while
    another replica of its group is up.
    """

    def __init__(self, replicas: Replicas) -> None:
        self.replicas = replicas
        self._serial = 0
        self._load = {group: [0] * replicas.count(group) for group in replicas.replicated}
        self._turn = dict.fromkeys(replicas.replicated, 0)
        self._down: set[tuple[str, int]] = set()

    def open(self) -> int:
        """Bind a new request; return its incarnation number."""
        self._serial += 1
        choice = {group: self._least_loaded(group) for group in self._load}
        for group, index in choice.items():
            self._load[group][index] += 1
            self._turn[group] = (index + 1) % len(self._load[group])
        return self.replicas.bind(self._serial, choice)

    def _least_loaded(self, group: str) -> int:
        load, turn = self._load[group], self._turn[group]
        return min(range(len(load)), key=lambda i: ((group, i) in self._down, load[i], (i - turn) % len(load)))

    def close(self, inc: int) -> None:
        """The request of incarnation ``inc`` is gone: it no longer loads its replicas."""
        for group, load in self._load.items():
            load[self.replicas.replica(group, inc)] -= 1

    def holds(self, process: str, inc: int) -> bool:
        """Whether ``process`` is where the request of incarnation ``inc`` has its stages of that group."""
        group, index = self.replicas.group_of(process)
        return self.replicas.replica(group, inc) == index

    def reachable(self, stage: str, inc: int) -> bool:
        """Whether the process holding ``stage`` for that request is up."""
        group = self.replicas.homes[stage]
        return (group, self.replicas.replica(group, inc)) not in self._down

    def gone(self, process: str) -> None:
        self._down.add(self.replicas.group_of(process))

    def up(self, process: str) -> None:
        self._down.discard(self.replicas.group_of(process))
