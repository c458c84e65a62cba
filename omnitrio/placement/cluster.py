"""A Ray cluster for one pipeline: connect to a given address, or start a loopback-only local one.

:func:`ray_cluster` is the only place this project calls ``ray.init``/``ray.shutdown``;
:func:`open_ray_cluster` runs it from trio, in a worker thread: importing Ray and
starting a local cluster take seconds, during which the event loop keeps serving.
With an address it connects and leaves the cluster running on exit.  Without one it
starts a local cluster that keeps every socket and connection on 127.0.0.1: usage stats
off and pointed at a closed loopback port, no dashboard (its process probes cloud
metadata addresses), the node address pinned to loopback (Ray would otherwise rewrite it
to the network card's address; a ``ray_bootstrap_config.yaml`` of ``{}`` in a private
``HOME`` while ``ray.init`` runs stops that), and its files in a short per-run temporary
directory that is removed after ``ray.shutdown()``.

Ray is an optional extra (``pip install 'omnitrio[ray]'``); without it
:func:`ray_cluster` raises :class:`ConfigError` saying how to install it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import trio

from omnitrio.errors import ConfigError

LOOPBACK = "127.0.0.1"
LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/",
}
"""Set before ray is imported; the cluster's processes inherit them."""
AUTH_MODE_ENV = "RAY_AUTH_MODE"


def loopback_env() -> None:
    """Set :data:`LOOPBACK_ENV` (call before anything imports ray)."""
    for key, value in LOOPBACK_ENV.items():
        os.environ[key] = value


def import_ray() -> Any:
    """The ``ray`` module, imported with :data:`LOOPBACK_ENV` set; ConfigError when not installed."""
    if "ray" not in sys.modules:
        loopback_env()
    try:
        import ray
    except ImportError:
        raise ConfigError("placement = 'ray' needs Ray: pip install 'omnitrio[ray]'") from None
    return ray


@contextmanager
def _bootstrap_home(directory: str) -> Iterator[None]:
    """``HOME`` is ``directory`` (holding a ``ray_bootstrap_config.yaml`` of ``{}``) inside the block."""
    with open(os.path.join(directory, "ray_bootstrap_config.yaml"), "w") as f:
        f.write("{}\n")
    old = os.environ.get("HOME")
    os.environ["HOME"] = directory
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = old


@contextmanager
def ray_cluster(address: str | None = None, *, num_cpus: int | None = None) -> Iterator[Any]:
    """Ray connected for the block; yields the ``ray`` module.

    ``address`` given: connect to that cluster (``num_cpus`` is ignored) and disconnect on
    exit.  None: start a loopback-only local cluster with ``num_cpus`` CPUs (Ray's default:
    every core) and stop it on exit, removing its files.  A driver already connected to
    Ray (``ray.is_initialized()``) is used as it is and left connected.
    """
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    if address is not None:
        ray.init(address=address, log_to_driver=False)
        try:
            yield ray
        finally:
            ray.shutdown()
        return
    if any(os.environ.get(key) != value for key, value in LOOPBACK_ENV.items()):
        raise ConfigError(
            "ray was imported before omnitrio could keep a local cluster on loopback: call "
            "omnitrio.placement.cluster.loopback_env() before importing ray, or give a ray_address"
        )
    temp = tempfile.mkdtemp(prefix="otray-", dir="/tmp")  # short: Ray's socket paths live under it
    auth_mode = os.environ.get(AUTH_MODE_ENV)
    try:
        with _bootstrap_home(temp):
            ray.init(
                num_cpus=num_cpus,
                include_dashboard=False,
                _node_ip_address=LOOPBACK,
                _temp_dir=os.path.join(temp, "r"),
                log_to_driver=False,
            )
        try:
            yield ray
        finally:
            ray.shutdown()
    finally:
        shutil.rmtree(temp, ignore_errors=True)
        _forget_auth_token(auth_mode)


def _forget_auth_token(auth_mode: str | None) -> None:
    """Leave Ray's token authentication as it was before this cluster started.

    ``ray.init`` of a local cluster writes a fresh token into ``HOME`` (here: the cluster's own
    directory, removed on exit), caches it for the process and sets ``RAY_AUTH_MODE``; the next
    local cluster would then start with the stale token and never come up.
    """
    if auth_mode is None:
        os.environ.pop(AUTH_MODE_ENV, None)
    else:
        os.environ[AUTH_MODE_ENV] = auth_mode
    try:
        from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]
    except ImportError:  # a Ray without token authentication
        return
    AuthenticationTokenLoader.instance().reset_cache()


@asynccontextmanager
async def open_ray_cluster(address: str | None = None, *, num_cpus: int | None = None) -> AsyncIterator[Any]:
    """:func:`ray_cluster` for trio code: its start and stop run in a worker thread.

    Leaving the block (cancelled or not) waits, shielded, until the cluster has stopped.
    """
    cluster = ray_cluster(address, num_cpus=num_cpus)
    ray = await trio.to_thread.run_sync(cluster.__enter__)
    try:
        yield ray
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(cluster.__exit__, None, None, None)
