"""Build ``bench/.peer-venv``: sglang-omni 0.1.9 without dependencies, plus only what its core imports.

The reference runtime pulls in the whole ``sglang`` package (a CUDA torch) through its
dependency list; the pipeline core needs only the small packages below and three names
from ``sglang``, which ``bench/peer/stub`` provides.  Nothing here installs an unpinned
torch or ``sglang`` itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from venv import EnvBuilder

PEER_DIR = Path(__file__).resolve().parent
BENCH_DIR = PEER_DIR.parent
VENV = BENCH_DIR / ".peer-venv"
PEER_PACKAGE = "sglang-omni==0.1.9"
# The pipeline core's own imports, pinned to what was measured with.
PEER_DEPS = [
    "pyzmq==27.3.0",
    "msgpack==1.2.4",
    "pydantic==2.14.4",
    "numpy==2.4.6",
    "msgspec==0.23.0",
    "starlette==1.10.0",
    "huggingface_hub==2.4.0",
    "torch==2.13.0",  # the CPU wheel from the local find-links; never unpinned
]


def python(venv: Path = VENV) -> Path:
    """A venv's interpreter, the peer's by default (it may not exist yet)."""
    return venv / "bin" / "python"


def create(venv: Path) -> list[str]:
    """Create ``venv`` unless it exists; the ``pip install`` command line of its interpreter."""
    if not python(venv).exists():
        print(f"creating {venv}", flush=True)
        EnvBuilder(with_pip=True, clear=False).create(venv)
    return [str(python(venv)), "-m", "pip", "install", "-q", "--disable-pip-version-check"]


def clean_env(pythonpath: list[Path]) -> dict[str, str]:
    """This process's environment for a venv's subprocesses: ``pythonpath`` only, no venv of ours."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = os.pathsep.join(str(path) for path in pythonpath)
    return env


def is_ready() -> bool:
    """True when the venv exists with the peer installed (cheap: no import, which takes seconds)."""
    return python().exists() and any(VENV.glob("lib/python*/site-packages/sglang_omni/pipeline/mp_runner.py"))


def imports_ok() -> bool:
    """True when the peer runtime imports with the stub on its path (slow: it imports torch)."""
    probe = "import sglang_omni.pipeline.mp_runner"
    result = subprocess.run([str(python()), "-c", probe], env=peer_env(), capture_output=True, check=False)
    return result.returncode == 0


def peer_env() -> dict[str, str]:
    """Environment for peer subprocesses: the stub and bench/peer/seed on PYTHONPATH, nothing else of ours."""
    return clean_env([PEER_DIR / "stub", PEER_DIR / "seed", BENCH_DIR.parent])


def setup() -> None:
    """Create the venv and install the peer (idempotent)."""
    pip = create(VENV)
    subprocess.run([*pip, "--no-deps", PEER_PACKAGE], check=True)
    subprocess.run([*pip, *PEER_DEPS], check=True)
    # pip reports sglang-omni's unmet requirements above; they are deliberately not installed.
    if not imports_ok():
        probe = [str(python()), "-c", "import sglang_omni.pipeline.mp_runner"]
        subprocess.run(probe, env=peer_env(), check=False)
        sys.exit("peer venv built but sglang_omni.pipeline.mp_runner does not import (traceback above)")
    print(f"peer ready: {python()}", flush=True)
