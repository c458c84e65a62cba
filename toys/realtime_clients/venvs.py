"""The realtime client libraries the tests drive, each in its own venv, pinned here and only here.

``toys/realtime_clients/.venvs/NAME`` (ignored by git) holds one client library and what it depends on;
nothing of it goes into the project's venv, and the server never imports any of it. The official
``openai`` SDK is a test dependency of the project itself (``pyproject.toml``), so its client runs
with the project's interpreter. :func:`interpreter` builds a venv on first use (idempotent, under a
file lock, so parallel test workers build each venv once); ``python -m toys.realtime_clients.venvs [NAME ...]``
builds them ahead and prints how long each install took.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
import time
from pathlib import Path

from toys.venvs import clean_env, create, import_problems, python

HERE = Path(__file__).resolve().parent
VENVS = HERE / ".venvs"
CLIENTS: dict[str, list[str]] = {
    "agents": ["openai-agents==0.24.0"],
    "pipecat": ["pipecat-ai==1.14.0"],
    "livekit": ["livekit-agents==1.8.9", "livekit-plugins-openai==1.8.9"],
}
"""Each client venv's requirements (pip's resolver picks their dependencies)."""
PROBES = {
    "agents": ["agents.realtime"],
    "pipecat": ["pipecat.services.openai.realtime.llm"],
    "livekit": ["livekit.plugins.openai.realtime"],
}


def interpreter(name: str) -> Path:
    """The Python of client venv ``name``, built first if it is missing or does not import its client."""
    venv = VENVS / name
    VENVS.mkdir(exist_ok=True)
    with open(VENVS / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if import_problems(python(venv), PROBES[name], clean_env()):
            started = time.monotonic()
            subprocess.run([*create(venv), *CLIENTS[name]], check=True, env=clean_env())
            (VENVS / f"{name}.install-seconds").write_text(f"{time.monotonic() - started:.1f}\n")
            problems = import_problems(python(venv), PROBES[name], clean_env())
            if problems:
                raise RuntimeError(f"client venv {name!r} built, but its client does not import: {problems}")
    return python(venv)


def main(names: list[str]) -> None:
    for name in names or list(CLIENTS):
        started = time.monotonic()
        interpreter(name)
        print(f"{name}: ready in {time.monotonic() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
