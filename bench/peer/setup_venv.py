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

import json
import os
import subprocess
import sys
import venv as venv_module
from pathlib import Path

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
# Settings of the calling shell that would make pip or the peer look somewhere else.
_FOREIGN = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_TARGET", "PIP_PREFIX", "PIP_USER")
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


def python(venv: Path = VENV) -> Path:
    """A venv's interpreter, the peer's by default (it may not exist yet)."""
    return venv / "bin" / "python"


def create(venv: Path) -> list[str]:
    """Create ``venv`` unless it exists; the ``pip install`` command line of its interpreter."""
    if not python(venv).exists():
        print(f"creating {venv}", flush=True)
        venv_module.EnvBuilder(with_pip=True, clear=False).create(venv)
    return [str(python(venv)), "-m", "pip", "install", "-q", "--disable-pip-version-check"]


def is_ready() -> bool:
    """True once :func:`setup` saw the peer and its dependencies import (cheap: no import)."""
    return READY.exists()


def clean_env() -> dict[str, str]:
    """This environment without what would point pip or Python at other packages."""
    return {k: v for k, v in os.environ.items() if k not in _FOREIGN}


def peer_env() -> dict[str, str]:
    """Environment for peer subprocesses: the stub and bench/peer/seed on PYTHONPATH, nothing else of ours."""
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(PEER_DIR / "stub"), str(PEER_DIR / "seed"), str(BENCH_DIR.parent)])
    return env


def import_problems(interpreter: Path, modules: list[str]) -> dict[str, str]:
    """``{module: error}`` for each of ``modules`` that does not import with ``interpreter`` and the peer's path."""
    try:
        done = subprocess.run(
            [str(interpreter), "-c", _PROBE, *modules], env=peer_env(), capture_output=True, text=True, check=False
        )
    except OSError as exc:
        return {str(interpreter): f"cannot run: {exc}"}
    if done.returncode != 0:
        return {str(interpreter): f"exited {done.returncode}: {done.stderr.strip()[-300:]}"}
    problems: dict[str, str] = json.loads(done.stdout.splitlines()[-1])
    return problems


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
        f"from a shell without {', '.join(_FOREIGN)} set."
    )
    return "\n".join(lines)


def setup() -> None:
    """Create the venv, install the peer and check that it imports (idempotent)."""
    READY.unlink(missing_ok=True)
    pip = create(VENV)
    subprocess.run([*pip, "--no-deps", PEER_PACKAGE], check=True, env=clean_env())
    subprocess.run([*pip, *PEER_DEPS], check=True, env=clean_env())
    # pip reports sglang-omni's unmet requirements above; they are deliberately not installed.
    problems = import_problems(python(), [*PEER_DEPS.values(), PEER_MODULE])
    if problems:
        sys.exit(advice(problems))
    READY.touch()
    print(f"peer ready: {python()}", flush=True)
