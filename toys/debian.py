"""Debian packages the tests need beside the Python ones (chromium, espeak-ng), installed on first use.

CI runs only the README's test command on a fresh machine, so a test that needs a Debian program
calls :func:`ensure` for it: apt installs the package once (parallel test workers wait on one
lock), and a machine where that cannot be done gets the reason instead, for the test's skip.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def ensure(package: str, program: str) -> str | None:
    """Install Debian's ``package`` unless ``program`` is on the PATH; None when it is there, else why not."""
    if shutil.which(program) is not None:
        return None
    apt = shutil.which("apt-get")
    if apt is None:
        return f"no {program} and no apt-get to install {package}"
    with open(Path(tempfile.gettempdir()) / "omnitrio-apt.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if shutil.which(program) is not None:
            return None
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = [apt, "install", "-y", "-q", "--no-install-recommends", package]
        for command in ([apt, "update", "-q"], install):
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                return f"apt-get could not install {package}: {done.stderr.strip()[-400:]}"
    return None if shutil.which(program) is not None else f"apt-get ran but {program} is missing"
