"""The error a model file that cannot be served raises: it names the file and what is wrong."""

from __future__ import annotations

from pathlib import Path


class ModelFileError(ValueError):
    """A GGUF file llama.cpp cannot serve (missing, unreadable, an architecture it does not know)."""

    def __init__(self, path: Path | str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.path, self.problem)
