"""Side virtualenvs that bench/ and tests/ build beside the project's own (the peer's, SGLang's).

:func:`create` makes one (idempotent) and gives the ``pip install`` command line of its
interpreter; :func:`clean_env` is this environment without the settings that would point pip
or Python at other packages, so pip judges what is installed by what the venv itself holds;
:func:`import_problems` says which modules do not import with a venv's interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import venv as venv_module
from collections.abc import Mapping
from pathlib import Path

FOREIGN = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_TARGET", "PIP_PREFIX", "PIP_USER")
"""Settings of the calling shell that would make pip or the venv's Python look somewhere else."""
_PROBE = """
import importlib, json, sys
problems = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        problems[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(problems))
"""


def python(venv: Path) -> Path:
    """A venv's interpreter (it may not exist yet)."""
    return venv / "bin" / "python"


def create(venv: Path) -> list[str]:
    """Create ``venv`` unless it exists; the ``pip install`` command line of its interpreter."""
    if not python(venv).exists():
        print(f"creating {venv}", flush=True)
        venv_module.EnvBuilder(with_pip=True, clear=False).create(venv)
    return [str(python(venv)), "-m", "pip", "install", "-q", "--disable-pip-version-check"]


def clean_env() -> dict[str, str]:
    """This environment without what would point pip or Python at other packages."""
    return {k: v for k, v in os.environ.items() if k not in FOREIGN}


def import_problems(interpreter: Path, modules: list[str], env: Mapping[str, str]) -> dict[str, str]:
    """``{module: error}`` for each of ``modules`` that does not import with ``interpreter`` and ``env``."""
    try:
        done = subprocess.run(
            [str(interpreter), "-c", _PROBE, *modules], env=dict(env), capture_output=True, text=True, check=False
        )
    except OSError as exc:
        return {str(interpreter): f"cannot run: {exc}"}
    if done.returncode != 0:
        return {str(interpreter): f"exited {done.returncode}: {done.stderr.strip()[-300:]}"}
    problems: dict[str, str] = json.loads(done.stdout.splitlines()[-1])
    return problems
