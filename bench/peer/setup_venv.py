"""Build ``bench/.peer-venv``: sglang-omni 0.1.9 without dependencies, plus only what its core imports.

The reference runtime pulls in the whole ``sglang`` package (a CUDA torch) through its
dependency list; the pipeline core needs only the small packages below and three names
from ``sglang``, which ``bench/peer/stub`` provides.  Nothing here installs an unpinned
torch or ``sglang`` itself.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

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


def python() -> Path:
    """The peer venv's interpreter (it may not exist yet)."""
    return VENV / "bin" / "python"


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
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = os.pathsep.join([str(PEER_DIR / "stub"), str(PEER_DIR / "seed"), str(BENCH_DIR.parent)])
    return env


def setup() -> None:
    """Create the venv and install the peer (idempotent)."""
    if not python().exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True, clear=False).create(VENV)
    pip = [str(python()), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "--no-deps", PEER_PACKAGE], check=True)
    subprocess.run([*pip, *PEER_DEPS], check=True)
    # pip reports sglang-omni's unmet requirements above; they are deliberately not installed.
    if not imports_ok():
        probe = [str(python()), "-c", "import sglang_omni.pipeline.mp_runner"]
        subprocess.run(probe, env=peer_env(), check=False)
        sys.exit("peer venv built but sglang_omni.pipeline.mp_runner does not import (traceback above)")
    print(f"peer ready: {python()}", flush=True)
