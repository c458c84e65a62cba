"""Model files that ship inside installed registry packages.

Weights are found by locating the package on ``sys.path`` without importing it (importing
``silero_vad`` would pull in torch), so a missing package is a clear ``FileNotFoundError``
naming it, and nothing is ever downloaded.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def package_dir(module: str) -> Path | None:
    """The directory of an installed package, or None when it is not installed."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def package_file(module: str, relative: str, *, install_hint: str) -> Path:
    """A file inside an installed package; ``FileNotFoundError`` says which package to install."""
    directory = package_dir(module)
    if directory is None:
        raise FileNotFoundError(f"package {module!r} is not installed ({install_hint})")
    path = directory / relative
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the installed package {module!r} ({install_hint})")
    return path
