"""Test-only: let the CUDA build of torchvision import next to the CPU torch (SGLang imports it).

torchvision's ``_C`` extension does not load against the CPU torch, so its operators are never
defined and registering fake/autograd kernels for them raises ``RuntimeError("operator
torchvision::nms does not exist")`` at import.  While ``torchvision`` itself is being imported, and
only then, those registrations skip an operator that does not exist; nothing else is changed, and
torch is not imported before something asks for torchvision.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

_PATCHED = ("register_fake", "register_autograd")


def _skip_missing(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            result = fn(*args, **kwargs)
        except RuntimeError as exc:
            if not str(exc).endswith("does not exist"):
                raise
            return None
        # register_fake(op) returns the decorator that does the registering.
        return _skip_missing(result) if inspect.isfunction(result) and result.__name__ == "register" else result

    return call


class _TorchvisionImport(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self._finding = False

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != "torchvision" or self._finding:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_tolerant(module: ModuleType) -> None:
            import torch.library

            saved = {name: getattr(torch.library, name) for name in _PATCHED}
            for name, fn in saved.items():
                setattr(torch.library, name, _skip_missing(fn))
            try:
                exec_module(module)
            finally:
                for name, fn in saved.items():
                    setattr(torch.library, name, fn)

        spec.loader.exec_module = exec_tolerant  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _TorchvisionImport())
