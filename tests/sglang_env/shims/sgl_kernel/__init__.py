"""Test-only stand-in for ``sgl_kernel`` (SGLang's CUDA/CPU kernels, a wheel built for CUDA torch).

SGLang imports names from ``sgl_kernel`` and its submodules at import time, whatever the device.
Every name here, and every submodule's, is a :class:`Missing` kernel: importing it works, calling
it raises ``NotImplementedError`` naming the kernel.  SGLang's CPU decode path with
``attention_backend="torch_native"`` and ``sampling_backend="pytorch"`` calls none of them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NoReturn


class Missing:
    """A kernel that is not here: attributes are more missing kernels, calls raise."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(f"{self._name}: the test stub of sgl_kernel has no kernels")

    def __getattr__(self, attr: str) -> Missing:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Missing(f"{self._name}.{attr}")

    def __repr__(self) -> str:
        return f"<missing kernel {self._name}>"


class _StubModule(ModuleType):
    def __getattr__(self, attr: str) -> Missing:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Missing(f"{self.__name__}.{attr}")


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any ``sgl_kernel.x.y`` imports as a stub module."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if not fullname.startswith(__name__ + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: ModuleType) -> None:
        return None


sys.modules[__name__].__class__ = _StubModule
sys.meta_path.append(_Submodules())
