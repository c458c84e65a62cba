"""A package's public names loaded on first use (PEP 562), so importing one of its submodules loads no other.

:func:`lazy_names` gives a package the ``__getattr__`` and ``__dir__`` it assigns at module level: a name of
``homes`` is imported from its home module the first time it is read and kept in the package's namespace
(so later reads are plain lookups); any other name is an ``AttributeError`` naming the package.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, homes: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` (its ``__name__``), whose names live in ``homes``
    (name → module)."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes})

    return __getattr__, __dir__


__all__ = ["lazy_names"]
