"""A process group as a Ray actor, running the same child entry as a local stage process.

:func:`start_actor` places one process group on the cluster with the resources its
config asks for and returns an :class:`ActorProcess`, which the children supervisor
(:mod:`omnitrio.children`) watches like a local ``trio.Process``: ``wait()`` returns when
the actor's work ends — the group shut down, or the actor died (Ray reports it) — and
``kill()`` ends it.  An actor whose work has ended is killed, so no idle actor is left.

Addresses travel through Ray: the actor reports its node's address before it serves,
and the group listens there on a TCP port of its choosing
(``tcp://<node address>:*``), which it sends back in its ``Ready`` message.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from typing import Any

import attrs
import trio

from omnitrio.child import ChildSpec
from omnitrio.errors import StartupError


class GroupActor:
    """The actor class: one per process group generation."""

    def node(self) -> tuple[str, int]:
        """This actor's node address and process id."""
        import ray

        return ray.util.get_node_ip_address(), os.getpid()

    def serve(self, path: str, blob: bytes) -> int:
        """Run the group's stages (as :func:`omnitrio.child.entry` does) until told to stop."""
        sys.path[:0] = [p for p in json.loads(path) if p not in sys.path]
        from omnitrio.child import main

        code = main(pickle.loads(blob))  # threads it left behind end with the actor (the owner kills it)
        if code:
            sys.exit(code)
        return 0


def actor_options(resources: dict[str, float]) -> dict[str, Any]:
    """Ray actor options for a group's resources: ``num_cpus``/``num_gpus`` and custom ones.

    A group asks for nothing it does not name (``num_cpus`` 0), like a local child process.
    """
    custom = {k: v for k, v in resources.items() if k not in ("num_cpus", "num_gpus")}
    options: dict[str, Any] = {
        "num_cpus": resources.get("num_cpus", 0),
        "num_gpus": resources.get("num_gpus", 0),
        "max_restarts": 0,  # the supervisor restarts, on a fresh address
    }
    if custom:
        options["resources"] = custom
    return options


@attrs.define(eq=False)
class ActorProcess:
    """A running group actor, seen as a process: ``pid``, ``returncode``, ``wait()``, ``kill()``."""

    ray: Any
    actor: Any
    pid: int
    work: Any
    """The ``serve`` call's object ref: it resolves when the group stops or the actor dies."""
    returncode: int | None = None
    cause: str = ""

    async def wait(self) -> int:
        """Wait until the group's work ends; then kill the actor.  0: it shut down; 1: it died."""
        try:
            await trio.to_thread.run_sync(self.ray.get, self.work, abandon_on_cancel=True)
            self.returncode = 0
        except Exception as exc:  # RayActorError and kin: the actor is gone
            self.returncode = 1
            self.cause = f"{type(exc).__name__}: {exc}"
        finally:
            self.kill()
        return self.returncode

    def kill(self) -> None:
        self.ray.kill(self.actor, no_restart=True)


async def start_actor(ray: Any, spec: ChildSpec, resources: dict[str, float], timeout: float) -> ActorProcess:
    """Place ``spec.process`` on the cluster and start serving; raise StartupError if Ray
    cannot place it within ``timeout`` seconds."""
    actor = ray.remote(GroupActor).options(**actor_options(resources)).remote()

    def placed() -> tuple[str, int]:
        return ray.get(actor.node.remote(), timeout=timeout)  # type: ignore[no-any-return]

    try:
        host, pid = await trio.to_thread.run_sync(placed, abandon_on_cancel=True)
    except BaseException as exc:
        ray.kill(actor, no_restart=True)
        if not isinstance(exc, Exception):
            raise
        raise StartupError(
            f"process {spec.process!r}: Ray could not place it with {actor_options(resources)}: {exc}"
        ) from None
    addresses = {**spec.addresses, spec.process: f"tcp://{host}:*"}
    spec = attrs.evolve(spec, addresses=addresses, parent_pid=0)
    work = actor.serve.remote(json.dumps(sys.path), pickle.dumps(spec))
    return ActorProcess(ray, actor, pid, work)
