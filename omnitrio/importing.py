"""Resolve the dotted paths a config names (``"pkg.mod.fn"`` or ``"pkg.mod:fn"``)."""

from __future__ import annotations

import importlib
from typing import Any


class ImportPathError(ValueError):
    """The path does not name an importable object; the message says which part failed."""


def import_object(path: str) -> Any:
    """Import and return the object that ``path`` names.

    Both ``module.attr`` and ``module:attr`` spellings are accepted; nested attributes
    (``module:Class.method``) work with the colon form.
    """
    if not isinstance(path, str) or not path.strip():
        raise ImportPathError(f"expected a dotted path such as 'module.function', got {path!r}")
    if ":" in path:
        module_name, _, attr_path = path.partition(":")
    else:
        module_name, _, attr_path = path.rpartition(".")
    if not module_name or not attr_path:
        raise ImportPathError(f"{path!r} must name a module and an attribute, e.g. 'module.function'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportPathError(f"cannot import module {module_name!r} for {path!r}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportPathError(f"module {module_name!r} has no attribute {attr_path!r} (from {path!r})") from None
    return obj
