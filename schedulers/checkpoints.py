"""Hugging Face checkpoint directories, whatever the model family: the index, the shards, one part's weights.

A checkpoint directory holds its weights as safetensors shards listed in ``model.safetensors.index.json``
(``weight_map``: tensor name → shard file), or as one ``model.safetensors``.  A family's own checkpoint
module (``schedulers.<family>.checkpoint``) reads its configuration and adds its rules; what is here
knows nothing of any model.  Every error is a :class:`CheckpointError` whose message names the file and
what is wrong with it.

* :func:`weight_map` reads the index and checks that every shard it names exists (no weights read);
* :func:`parse_config` reads a family's ``config.json`` into its configuration class;
* :func:`check_layout` checks the shards, the parts and the processor files without reading weights;
* :func:`check_processor_files` checks the tokenizer, processor configuration and chat template are there;
* :func:`check_shards` checks that each shard holds the tensors the index puts in it (safetensors
  headers only);
* :func:`read_tensors` reads the tensors under one prefix, opening only the shards that hold them;
* :func:`assign` puts tensors into a module strictly (a missing or unexpected name is an error);
* :func:`load_weights` is the two together: one part of a checkpoint into its module;
* :class:`Family` is a family's configuration loader, full check and ``omnitrio check`` preflight;
  :func:`checked_by` gives a stage factory its preflight.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import attrs
import torch

from schedulers.devices import check_placement

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
CHAT_TEMPLATE_FILES = ("chat_template.json", "chat_template.jinja")
PREPROCESSOR_FILE = "preprocessor_config.json"


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be served; the message names the file and the fault."""


def require_model_dir(model_dir: str | Path | None) -> str:
    """``model_dir`` as a string, or a :class:`CheckpointError` saying how to set it."""
    if model_dir is None or not str(model_dir):
        raise CheckpointError("model_dir: not set; pass the checkpoint directory (serve --model DIR)")
    return str(model_dir)


def directory(model_dir: str | Path) -> Path:
    """``model_dir`` as a :class:`Path`, or a :class:`CheckpointError` when it is not a directory."""
    path = Path(model_dir)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a checkpoint directory (does not exist or is not a directory)")
    return path


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; missing, unreadable or not an object is a :class:`CheckpointError`."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def check_model_type(path: Path, raw: dict[str, Any], model_type: str, family: str) -> None:
    """A :class:`CheckpointError` unless ``raw`` (``path``'s content) is a ``model_type`` configuration."""
    found = raw.get("model_type")
    if found != model_type:
        raise CheckpointError(f"{path}: model_type is {found!r}, not {model_type!r} ({family})")


def check_equal(path: Path, *fields: tuple[str, Any]) -> None:
    """A :class:`CheckpointError` naming ``path`` and every ``(field, value)`` unless all values are equal."""
    if len({value for _, value in fields}) > 1:
        listed = ", ".join(f"{name} = {value}" for name, value in fields)
        raise CheckpointError(f"{path}: these must be equal: {listed}")


def check_processor_files(model_dir: Path) -> None:
    """``model_dir`` holds what a processor reads: a tokenizer, a readable ``preprocessor_config.json`` and
    a chat template; else a :class:`CheckpointError` naming what is missing."""
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        raise CheckpointError(f"{model_dir}: no tokenizer ({' or '.join(TOKENIZER_FILES)})")
    read_json(model_dir / PREPROCESSOR_FILE)
    if not any((model_dir / name).is_file() for name in CHAT_TEMPLATE_FILES):
        raise CheckpointError(f"{model_dir}: no chat template ({' or '.join(CHAT_TEMPLATE_FILES)})")


def parse_config(path: Path, model_type: str, family: str, config_class: Any) -> Any:
    """``config_class`` (a transformers configuration) from the JSON at ``path``, which must be a
    ``model_type`` configuration; every fault is a :class:`CheckpointError` naming ``path`` and ``family``."""
    raw = read_json(path)
    check_model_type(path, raw, model_type, family)
    try:
        return config_class.from_dict(raw)
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{path}: not a valid {family} configuration ({exc})") from None


def check_layout(model_dir: Path, parts: Iterable[str]) -> None:
    """What a stage reads besides the configuration, without reading weights: the index and its shards
    (:func:`check_shards`), a tensor under each of ``parts`` and the processor's files."""
    mapping = weight_map(model_dir)
    check_shards(model_dir, mapping)
    check_parts(model_dir, mapping, parts)
    check_processor_files(model_dir)


def index_path(model_dir: Path) -> Path:
    """The file that lists the tensors: the index, or the single weights file when there is no index."""
    return model_dir / INDEX_FILE if (model_dir / INDEX_FILE).is_file() else model_dir / SINGLE_FILE


def weight_map(model_dir: Path) -> dict[str, str]:
    """Tensor name → shard file name, from the index (or the single ``model.safetensors``).

    Every shard the index names must be a file in ``model_dir``; no tensor is read."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        mapping = read_json(index).get("weight_map")
        if not isinstance(mapping, dict) or not mapping:
            raise CheckpointError(f"{index}: no 'weight_map' (tensor name -> shard file)")
        for shard in set(mapping.values()):
            if not isinstance(shard, str) or Path(shard).name != shard:
                raise CheckpointError(f"{index}: {shard!r} is not a shard file name in this directory")
            if not (model_dir / shard).is_file():
                raise CheckpointError(f"{model_dir / shard}: missing (listed in {INDEX_FILE})")
        return mapping
    single = model_dir / SINGLE_FILE
    if single.is_file():
        return dict.fromkeys(shard_keys(single), SINGLE_FILE)
    raise CheckpointError(f"{index}: missing (and no single {SINGLE_FILE})")


def shard_keys(path: Path) -> list[str]:
    """The tensor names a safetensors file holds (its header only)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            return list(handle.keys())
    except (OSError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None


def keys_by_shard(mapping: dict[str, str]) -> dict[str, list[str]]:
    """The tensor names of ``mapping`` grouped by shard, in the index's order."""
    shards: dict[str, list[str]] = {}
    for key, shard in mapping.items():
        shards.setdefault(shard, []).append(key)
    return shards


def check_shards(model_dir: Path, mapping: dict[str, str]) -> None:
    """Each shard holds every tensor the index puts in it (headers only), else the shard is named."""
    for shard, keys in keys_by_shard(mapping).items():
        missing = sorted(set(keys) - set(shard_keys(model_dir / shard)))
        if missing:
            raise CheckpointError(
                f"{model_dir / shard}: the index ({INDEX_FILE}) lists {len(missing)} tensors this shard does not "
                f"hold, e.g. {missing[0]!r}"
            )


def check_parts(model_dir: Path, mapping: dict[str, str], parts: Iterable[str]) -> None:
    """Every prefix in ``parts`` (``"thinker."``, ...) names at least one tensor of the index."""
    for part in parts:
        if not any(key.startswith(part) for key in mapping):
            raise CheckpointError(f"{index_path(model_dir)}: no tensors of {part.rstrip('.')!r}")


def read_tensors(model_dir: str | Path, prefix: str) -> dict[str, torch.Tensor]:
    """Every tensor named ``prefix...``, by its name with ``prefix`` stripped; only their shards are opened."""
    from safetensors import safe_open

    path = directory(model_dir)
    wanted = {key: shard for key, shard in weight_map(path).items() if key.startswith(prefix)}
    if not wanted:
        raise CheckpointError(f"{index_path(path)}: no tensors under {prefix!r}")
    tensors: dict[str, torch.Tensor] = {}
    for shard, keys in keys_by_shard(wanted).items():
        shard_path = path / shard
        try:
            with safe_open(str(shard_path), framework="pt") as handle:
                held = set(handle.keys())
                for key in keys:
                    if key not in held:
                        raise CheckpointError(
                            f"{shard_path}: the index lists {key!r} here but the shard does not hold it"
                        )
                    tensors[key[len(prefix) :]] = handle.get_tensor(key)
        except (OSError, RuntimeError) as exc:
            raise CheckpointError(f"{shard_path}: cannot read this shard ({exc})") from None
    return tensors


def assign(module: torch.nn.Module, tensors: dict[str, torch.Tensor], where: str) -> None:
    """Put ``tensors`` into ``module``'s state dict, strictly, each in the dtype of the module's own.

    A name ``module`` lacks or a tensor it expects and ``tensors`` lacks raises :class:`CheckpointError`
    naming ``where``.  Tensors are assigned (``load_state_dict(assign=True)``), so ``module`` may be built
    on CPU or on the ``meta`` device; buffers outside the state dict stay as the module built them.
    """
    expected = module.state_dict()
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        what = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        raise CheckpointError(f"{where}: the tensors do not match {type(module).__name__} ({what})")
    state = {name: tensor.to(expected[name].dtype) for name, tensor in tensors.items()}
    module.load_state_dict(state, strict=True, assign=True)


def load_weights(model_dir: str | Path, prefix: str, module: torch.nn.Module) -> None:
    """Load every tensor named ``prefix...`` into ``module`` (``prefix`` stripped): :func:`read_tensors`,
    then :func:`assign`.  Only the shards the index lists for ``prefix`` are opened."""
    tensors = read_tensors(model_dir, prefix)
    assign(module, tensors, f"{index_path(Path(model_dir))} under {prefix!r}")


@attrs.frozen
class Family:
    """One model family's checkpoint: what :func:`parse_config` and :func:`check_layout` need to know of it,
    and its own rules.  A family's checkpoint module builds one and exports its bound methods.

    ``config_class`` imports and returns the transformers configuration class (imported on first use);
    ``check_config(config, path)`` raises a :class:`CheckpointError` for a configuration whose parts disagree;
    ``check_audio_files(model_dir, config)`` checks the files only audio output reads (run when the
    configuration enables it)."""

    model_type: str
    name: str
    parts: tuple[str, ...]  # the first: the part every checkpoint holds; the rest: audio output's
    config_class: Callable[[], Any]
    check_config: Callable[[Any, Path], None]
    check_audio_files: Callable[[Path, Any], object] | None = None

    def load_config(self, model_dir: str | Path) -> Any:
        """The configuration from ``model_dir/config.json``, its parts checked for consistency (no weights)."""
        path = directory(model_dir) / "config.json"
        config = parse_config(path, self.model_type, self.name, self.config_class())
        self.check_config(config, path)
        return config

    def check_checkpoint(self, model_dir: str | Path) -> None:
        """Everything :meth:`load_config` checks, plus every file a stage reads (:func:`check_layout`)."""
        path = directory(model_dir)
        config = self.load_config(path)
        check_layout(path, self.parts if config.enable_audio_output else self.parts[:1])
        if config.enable_audio_output and self.check_audio_files is not None:
            self.check_audio_files(path, config)

    def preflight(self, *, model_dir: str | None = None, **factory_args: Any) -> None:
        """What ``omnitrio check`` runs for a stage reading this checkpoint: its ``device`` and ``dtype``
        (:func:`schedulers.devices.check_placement`), then :meth:`check_checkpoint`."""
        check_placement(**factory_args)
        self.check_checkpoint(require_model_dir(model_dir))


F = TypeVar("F", bound=Callable[..., Any])


def checked_by(preflight: Callable[..., None]) -> Callable[[F], F]:
    """A stage factory's decorator: ``omnitrio check`` calls ``preflight`` with the factory's arguments (it
    reads the factory's ``preflight`` attribute) before anything is loaded."""

    def mark(factory: F) -> F:
        factory.preflight = preflight  # type: ignore[attr-defined]
        return factory

    return mark


__all__ = [
    "CHAT_TEMPLATE_FILES",
    "INDEX_FILE",
    "PREPROCESSOR_FILE",
    "SINGLE_FILE",
    "TOKENIZER_FILES",
    "CheckpointError",
    "Family",
    "assign",
    "check_equal",
    "check_layout",
    "check_model_type",
    "check_parts",
    "check_processor_files",
    "check_shards",
    "checked_by",
    "directory",
    "index_path",
    "keys_by_shard",
    "load_weights",
    "parse_config",
    "read_json",
    "read_tensors",
    "require_model_dir",
    "shard_keys",
    "weight_map",
]
