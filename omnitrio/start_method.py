"""How a pipeline's stage processes start, and in what environment.

Each is a fork of the pipeline's fork server (:mod:`omnitrio.forkserver`) by default, a fresh
interpreter with ``OMNITRIO_START_METHOD=spawn`` in the environment (:func:`forking` says which);
both inherit :func:`child_environment`.  :func:`start_fork_server_early` starts the fork server before
the caller loads its config.  Light on purpose: the CLI imports it before anything heavy, so that the
server's start waits on nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from omnitrio.forkserver import preload_modules, start_early

START_METHOD_ENV = "OMNITRIO_START_METHOD"
"""``forkserver`` (the default) or ``spawn``: how stage processes start (module docstring)."""


def forking() -> bool:
    """Whether stage processes start as forks of a fork server (else as fresh interpreters)."""
    return os.environ.get(START_METHOD_ENV, "forkserver") != "spawn"


def child_environment() -> dict[str, str]:
    """The environment of a stage process (and of the fork server its forks inherit it from)."""
    env = dict(os.environ)
    env["OMNITRIO_PARENT_PID"] = str(os.getpid())  # which pipeline owns this process
    env.setdefault("OMP_NUM_THREADS", "1")  # a factory may raise it; the cores are shared by every process
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP workers sleep: spinning starves the others
    env.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # torch.cuda.is_available() initialises no CUDA
    return env


def start_fork_server_early(factory_paths: Iterable[str]) -> None:
    """Start the fork server for stage processes whose factories are ``factory_paths`` now, before
    the caller loads (and so imports) the config; :func:`omnitrio.children.open_children` adopts it
    when it fits (:func:`omnitrio.forkserver.start_early`).  Nothing without paths or when not
    :func:`forking`."""
    paths = list(factory_paths)
    if paths and forking():
        start_early(preload_modules(paths), child_environment())
