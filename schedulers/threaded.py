"""ThreadedSimpleScheduler: a pool of worker threads over one compute function.

For stages whose compute blocks without holding the GIL (tokenizers, audio decoding,
remote calls), so requests must overlap.  It is :class:`~schedulers.simple.SimpleScheduler`
with ``max_concurrency`` workers, 8 by default (parallel workers exclude batching); a caller
may rely on:

* up to ``max_concurrency`` computes run at once; outputs come in completion order;
* ``abort`` of a request still waiting for a worker cancels it (its compute never runs);
  of a running one drops its result; of one not yet arrived is remembered, so its
  ``new_request`` is dropped when it comes (see :mod:`schedulers._idsets`);
* idle workers block on a queue: nothing polls.

Port note: SGLang-Omni's version also has ``enqueue``; here the runtime puts straight
into ``inbox`` and the scheduler thread hands work to the pool, so none is needed.
"""

from __future__ import annotations

from schedulers.simple import SimpleScheduler


class ThreadedSimpleScheduler(SimpleScheduler):
    """``compute_fn`` on ``max_concurrency`` worker threads (8 unless given); it must be re-entrant.

    Takes :class:`~schedulers.simple.SimpleScheduler`'s arguments.
    """

    default_max_concurrency = 8


__all__ = ["ThreadedSimpleScheduler"]
