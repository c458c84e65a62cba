"""A stage's warm-up: the steps its factory names, run on the serving thread before the stage reports ready.

A factory gives its scheduler a :class:`WarmUp` of named steps, each a call that pays what the first
request of one kind would otherwise pay: a lazy load, the first run of a model, the first pass through
an input path.  The scheduler's ``warm_up_serving_thread()`` calls :meth:`WarmUp.run`, which runs every
step in order on that thread (where per-thread state such as a kernel library's thread pool lives);
:attr:`WarmUp.warmed` then names the steps, which the scheduler shows as its ``warmed`` (see
:class:`omnitrio.contract.StageScheduler`).  A step that raises fails the stage's start, naming it.

A step shared by several stages of one process (one loaded model behind two stages) may carry a
``key``: it runs once per process, the first time a warm-up meets it, and counts as warmed for every
stage that names it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Protocol, TypeVar

import attrs

_done: set[Hashable] = set()
_locks: dict[Hashable, threading.Lock] = {}
_lock = threading.Lock()


@attrs.define
class WarmUp:
    """Named warm-up steps; see the module docstring."""

    steps: list[tuple[str, Callable[[], object], Hashable | None]] = attrs.field(factory=list)
    warmed: list[str] = attrs.field(factory=list)
    """The steps that have run (or, for a keyed step, had run in this process), in order."""

    def step(self, name: str, call: Callable[[], object], *, key: Hashable | None = None) -> WarmUp:
        """Add ``call`` as the step ``name`` (with ``key``: once per process); returns this warm-up."""
        self.steps.append((name, call, key))
        return self

    def run(self) -> None:
        """Run every step in order (module docstring); a step that raises raises ``RuntimeError`` naming it."""
        for name, call, key in self.steps:
            try:
                if key is None:
                    call()
                else:
                    with _lock:
                        shared = _locks.setdefault(key, threading.Lock())
                    with shared:  # a second stage waits for the first to finish the shared step
                        if key not in _done:
                            call()
                            _done.add(key)
            except Exception as exc:
                raise RuntimeError(f"warm-up step {name!r} failed: {exc!r}") from exc
            self.warmed.append(name)


class _Warmable(Protocol):
    warm_up: WarmUp


S = TypeVar("S", bound=_Warmable)


def with_warm_up(scheduler: S, steps: Callable[[S], WarmUp]) -> S:
    """``scheduler``, its ``warm_up`` set to ``steps(scheduler)``: the warm-up of a factory whose steps drive
    the very scheduler they warm (its model, its batch, its outputs)."""
    scheduler.warm_up = steps(scheduler)
    return scheduler
