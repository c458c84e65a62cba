"""Build ``bench/.peer-venv``: sglang-omni 0.1.9 without dependencies, plus only what its core imports.

The reference runtime pulls in the whole ``sglang`` package (a CUDA torch) through its
dependency list; the pipeline core needs only the small packages below and three names
from ``sglang``, which ``bench/peer/stub`` provides.  Nothing here installs an unpinned
torch or ``sglang`` itself.

pip runs without this shell's ``PYTHONPATH``, ``PIP_TARGET`` and the like, so it judges what is
installed by what the peer will see.  After installing, :func:`setup` imports every dependency and
the peer runtime in the venv; the venv counts as ready (:func:`is_ready`) only when all of them
import, and otherwise setup names what does not and says what to do.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from toys import venvs

PEER_DIR = Path(__file__).resolve().parent
BENCH_DIR = PEER_DIR.parent
VENV = BENCH_DIR / ".peer-venv"
READY = VENV / "omnitrio-peer-ready"
PEER_PACKAGE = "sglang-omni==0.1.9"
PEER_MODULE = "sglang_omni.pipeline.mp_runner"
# The pipeline core's own imports, pinned to what was measured with: requirement -> module.
PEER_DEPS = {
    "pyzmq==27.3.0": "zmq",
    "msgpack==1.2.4": "msgpack",
    "pydantic==2.14.4": "pydantic",
    "numpy==2.4.6": "numpy",
    "msgspec==0.23.0": "msgspec",
    "starlette==1.10.0": "starlette",
    "huggingface_hub==2.4.0": "huggingface_hub",
    "torch==2.13.0": "torch",  # the CPU wheel from the local find-links; never unpinned
}


def python() -> Path:
    """The peer's interpreter (it may not exist yet)."""
    return venvs.python(VENV)


def is_ready() -> bool:
    """True once :func:`setup` saw the peer and its dependencies import (cheap: no import)."""
    return READY.exists()


def peer_env() -> dict[str, str]:
    """Environment for peer subprocesses: the stub and bench/peer/seed on PYTHONPATH, nothing else of ours."""
    env = venvs.clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(PEER_DIR / "stub"), str(PEER_DIR / "seed"), str(BENCH_DIR.parent)])
    return env


def import_problems(interpreter: Path, modules: list[str]) -> dict[str, str]:
    """``{module: error}`` for each of ``modules`` that does not import with ``interpreter`` and the peer's path."""
    return venvs.import_problems(interpreter, modules, peer_env())


def advice(problems: dict[str, str]) -> str:
    """What did not import, and the commands that fix it."""
    lines = ["the peer venv was built, but this does not import in it:"]
    lines += [f"  {name}: {error}" for name, error in problems.items()]
    wanted = [req for req, module in PEER_DEPS.items() if module in problems]
    pip = f"{os.path.relpath(python())} -m pip install"
    lines.append("What to do:")
    if wanted:
        lines.append(f"  {pip} {' '.join(wanted)}")
    if PEER_MODULE in problems:
        lines.append(f"  {pip} --no-deps --force-reinstall {PEER_PACKAGE}")
    lines.append("  then run `python -m bench.peer setup` again (it checks the imports again).")
    lines.append(
        f"  If pip says they are installed already, remove {os.path.relpath(VENV)} and run setup again "
        f"from a shell without {', '.join(venvs.FOREIGN)} set."
    )
    return "\n".join(lines)


def setup() -> None:
    """Create the venv, install the peer and check that it imports (idempotent)."""
    READY.unlink(missing_ok=True)
    pip = venvs.create(VENV)
    subprocess.run([*pip, "--no-deps", PEER_PACKAGE], check=True, env=venvs.clean_env())
    subprocess.run([*pip, *PEER_DEPS], check=True, env=venvs.clean_env())
    # pip reports sglang-omni's unmet requirements above; they are deliberately not installed.
    problems = import_problems(python(), [*PEER_DEPS.values(), PEER_MODULE])
    if problems:
        sys.exit(advice(problems))
    READY.touch()
    print(f"peer ready: {python()}", flush=True)
