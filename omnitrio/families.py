"""The model families this repository serves: one line each, and which pipeline a ``--model PATH`` gets.

:data:`FAMILIES` names, per family, the ``model_type`` of its checkpoints' ``config.json``, the shipped
config that serves them (a file under ``configs/``) and the writer of its tiny random checkpoint (a
dotted path to ``write_checkpoint(directory, *, size, seed) -> Path``, imported only when called:
omnitrio never imports ``schedulers``).  A family is one line here.

* :func:`config_for_model`: ``serve --model PATH`` and ``check --model PATH`` without ``--config``: a
  checkpoint directory gets its family's config by its ``model_type``, a ``.gguf`` file the default
  pipeline (its responder loads it); anything else is a :class:`~omnitrio.errors.ConfigError` naming
  what was found and what is served, raised before anything loads.
* :func:`write_tiny_model`: ``python -m omnitrio tiny-model FAMILY DIR`` writes a random checkpoint laid
  out as the family's released one, small enough that its whole pipeline answers on a CPU in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import attrs

from omnitrio.errors import ConfigError
from omnitrio.importing import import_object

Size = Literal["tiny", "medium"]
SIZES: tuple[Size, ...] = ("tiny", "medium")
CONFIGS = Path(__file__).resolve().parent.parent / "configs"
GGUF_SUFFIX = ".gguf"


@attrs.frozen
class Family:
    model_type: str
    """``config.json``'s ``model_type`` of the family's checkpoints."""
    config: str
    """The file under ``configs/`` that serves them with ``--model DIR``."""
    tiny_writer: str
    """Dotted path of ``write_checkpoint(directory, *, size, seed) -> Path``."""


FAMILIES: dict[str, Family] = {
    "qwen3-omni": Family("qwen3_omni_moe", "qwen3-omni.toml", "schedulers.qwen3_omni.tiny.write_checkpoint"),
    "qwen2.5-omni": Family("qwen2_5_omni", "qwen2.5-omni.toml", "schedulers.qwen2_5_omni.tiny.write_checkpoint"),
}


def config_for(family: str) -> Path:
    """The shipped config that serves ``family``'s checkpoints."""
    return CONFIGS / FAMILIES[family].config


def served() -> str:
    """What ``--model`` accepts, for error messages."""
    types = ", ".join(f"{family.model_type} ({name})" for name, family in FAMILIES.items())
    return f"a checkpoint directory whose config.json has model_type {types}, or a {GGUF_SUFFIX} file"


def config_for_model(model: Path) -> Path | None:
    """The shipped config that serves ``model``: its family's for a checkpoint directory, None (the default
    pipeline) for a ``.gguf`` file; a :class:`ConfigError` naming what was found and what is served."""
    if model.suffix.lower() == GGUF_SUFFIX and not model.is_dir():
        return None
    if not model.is_dir():
        found = "does not exist" if not model.exists() else "is not a directory"
        raise ConfigError(f"--model {model}: {found}; --model takes {served()}")
    path = model / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--model {model}: no config.json; --model takes {served()}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not readable JSON ({exc})") from None
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    for family in FAMILIES.values():
        if family.model_type == model_type:
            return CONFIGS / family.config
    raise ConfigError(f"{path}: model_type {model_type!r} is not served here; --model takes {served()}")


def write_tiny_model(family: str, directory: Path, *, size: Size = "tiny", seed: int = 0) -> Path:
    """Write ``family``'s random checkpoint of ``size`` into ``directory`` (created); the same ``seed``
    writes the same weights.  ``ValueError`` names the families for an unknown one."""
    found = FAMILIES.get(family)
    if found is None:
        raise ValueError(f"no tiny model for {family!r}; families: {', '.join(sorted(FAMILIES))}")
    if size not in SIZES:
        raise ValueError(f"size must be one of {list(SIZES)}, got {size!r}")
    written: Path = import_object(found.tiny_writer)(directory, size=size, seed=seed)
    return written
