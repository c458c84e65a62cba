"""A separate venv with a real SGLang engine on CPU, for ``tests/test_sglang_engine.py`` only.

``python -m tests.sglang_env setup`` builds ``tests/.sglang-venv`` (about 3.4 GB, ignored by git):
``sglang`` (``SGLANG_VERSION``) without its dependencies, the CPU torch wheel, the pure-Python
dependencies pinned in ``requirements.txt`` beside this file, ``triton`` and ``torchvision`` without
theirs, then this checkout editable (``--no-deps``) with its light dependencies.  Nothing of it goes
into the project's own venv.  ``python -m tests.sglang_env test`` runs the marked tests there.

Subprocesses get :func:`engine_env`: ``shims/`` first on ``PYTHONPATH`` (a ``sitecustomize`` that
lets the CUDA build of torchvision import, and a ``sgl_kernel`` whose functions raise
``NotImplementedError``; the CPU decode path calls none of them), CPU engine on, hub offline.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from toys.venvs import clean_env, create, python

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VENV = ROOT / "tests" / ".sglang-venv"
SHIMS = HERE / "shims"
REQUIREMENTS = HERE / "requirements.txt"
SGLANG_VERSION = "0.5.23"
TORCH = "torch==2.13.0"  # the CPU wheel from the local find-links; never unpinned
# Imported by sglang whatever the device; installed without their (CUDA) dependencies.
NO_DEPS = [f"sglang=={SGLANG_VERSION}", "triton==3.8.0", "torchvision==0.28.0"]
# What this checkout and its tests import beyond sglang's own pins (the project venv's versions).
PROJECT_DEPS = [
    "trio==0.35.0",
    "trio-websocket==0.12.2",
    "cattrs==26.2.1",
    "hypercorn==0.18.0",
    "soxr==1.1.0",
    "pytest==9.2.0",
    "pytest-trio==0.8.0",
    "pytest-timeout==2.4.0",
]
PROBE = "import sglang, sglang.srt.entrypoints.engine; print(sglang.__version__)"


def engine_env() -> dict[str, str]:
    """Environment for the venv's processes: shims and this checkout on the path, CPU engine, offline."""
    env = clean_env()
    env.update(PYTHONPATH=os.pathsep.join([str(SHIMS), str(ROOT)]))
    env.update(SGLANG_USE_CPU_ENGINE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def setup() -> None:
    """Build the venv (idempotent: pip skips what is installed) and check that sglang imports."""
    pip = create(VENV)
    constrained = [*pip, "-c", str(REQUIREMENTS)]
    for step in (
        [*pip, "--no-deps", "-r", str(REQUIREMENTS)],
        [*constrained, TORCH],
        [*pip, "--no-deps", *NO_DEPS],
        [*constrained, *PROJECT_DEPS],
        [*pip, "--no-deps", "-e", str(ROOT)],
    ):
        print("+", " ".join(step[3:]), flush=True)
        subprocess.run(step, check=True)
    probe = subprocess.run([str(python(VENV)), "-c", PROBE], env=engine_env(), check=False)
    if probe.returncode:
        sys.exit(f"{VENV} built but sglang does not import (traceback above)")
    print(f"sglang ready: {python(VENV)}", flush=True)


def run_tests(args: list[str]) -> int:
    """``pytest -m sglang_engine`` in the venv (extra ``args`` passed on); its exit status."""
    if not python(VENV).exists():
        print(f"no {VENV}: run `python -m tests.sglang_env setup` first", file=sys.stderr)
        return 2
    command = [str(python(VENV)), "-m", "pytest", "-m", "sglang_engine", "tests/test_sglang_engine.py", *args]
    return subprocess.run(command, cwd=ROOT, env=engine_env(), check=False).returncode
