"""A stage process is declared dead as soon as its connection drops, even before its watcher says so.

Over zmq (``ipc://`` here, TCP between Ray actors) the parent's link to a stage process
reports the drop; the process watcher (a pidfd here, Ray for an actor) may hear of the death
later.  Here it hears 2 s late: the requests fail anyway, naming the connection.
"""

from __future__ import annotations

import os
import signal

import attrs
import pytest
import trio

import omnitrio.children
from omnitrio import FactoryArgs, RequestFailed, open_pipeline
from omnitrio.placement.actors import ActorProcess
from tests.pipelines import T, chain_config, settled, until_alive, until_held

LATE = 2.0


async def late_reap(process: trio.Process | ActorProcess, exited: trio.Event) -> None:
    """The reaper, hearing of every exit ``LATE`` seconds after it happened."""
    try:
        await process.wait()
        await trio.sleep(LATE)
    finally:
        exited.set()


async def test_a_process_whose_connection_drops_fails_its_requests_before_its_watcher_knows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(omnitrio.children, "_reap", late_reap)
    config = attrs.evolve(chain_config(2, process=True), transport="zmq")
    config.stages[1].factory_path = f"{T}.create_slow"
    config.stages[1].factory = FactoryArgs(seconds=2.0)
    async with open_pipeline(config) as pipeline:
        victim = (await pipeline.health())["stages"]["s1"]["pid"]

        async def caller() -> None:
            with pytest.raises(RequestFailed, match=r"process 'p_s1' \(stages s1\) died \(its connection closed\)"):
                await pipeline.submit("r", "x")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            await until_held(pipeline, "s1")
            os.kill(victim, signal.SIGKILL)
        await until_alive(pipeline, "s1", timeout=60)
        assert await pipeline.submit("after", "y", timeout=60) == {"raw_inputs": "y"}
        await settled(pipeline)
