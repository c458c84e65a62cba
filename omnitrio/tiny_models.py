"""Tiny random checkpoints of the model families this repository serves: a pipeline tried without weights.

``python -m omnitrio tiny-model FAMILY DIR`` writes one: the files a released checkpoint has (config,
sharded safetensors, tokenizer, processor files), with random weights small enough that the whole
pipeline answers on a CPU in seconds, then ``serve --config CONFIG --model DIR`` serves it.

:data:`TINY_MODELS` names, per family, the writer's dotted path (``write(directory, *, size, seed) ->
Path``, imported only when called: omnitrio never imports ``schedulers``) and the shipped config that
serves it.  A family is one line here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import attrs

from omnitrio.importing import import_object

Size = Literal["tiny", "medium"]
SIZES: tuple[Size, ...] = ("tiny", "medium")
CONFIGS = Path(__file__).resolve().parent.parent / "configs"


@attrs.frozen
class TinyModel:
    writer: str
    """Dotted path of ``write_checkpoint(directory, *, size, seed) -> Path``."""
    config: str
    """The file under ``configs/`` that serves it with ``--model DIR``."""


TINY_MODELS: dict[str, TinyModel] = {
    "qwen3-omni": TinyModel("schedulers.qwen3_omni.tiny.write_checkpoint", "qwen3-omni.toml"),
}


def write_tiny_model(family: str, directory: Path, *, size: Size = "tiny", seed: int = 0) -> Path:
    """Write ``family``'s random checkpoint of ``size`` into ``directory`` (created); the same ``seed``
    writes the same weights.  ``ValueError`` names the families for an unknown one."""
    model = TINY_MODELS.get(family)
    if model is None:
        raise ValueError(f"no tiny model for {family!r}; families: {', '.join(sorted(TINY_MODELS))}")
    if size not in SIZES:
        raise ValueError(f"size must be one of {list(SIZES)}, got {size!r}")
    written: Path = import_object(model.writer)(directory, size=size, seed=seed)
    return written


def config_for(family: str) -> Path:
    """The shipped config that serves ``family``'s checkpoints."""
    return CONFIGS / TINY_MODELS[family].config
