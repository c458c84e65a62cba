"""Pipeline configuration from outside Python: plain data, TOML files and ``--set`` overrides.

:func:`from_dict` builds a :class:`~omnitrio.config.PipelineConfig` from parsed TOML or JSON,
refusing unknown keys and wrong types with a :class:`~omnitrio.errors.ConfigError` that names
where they are; :func:`apply_override` applies one ``key.path=value`` to such data; :func:`load`
reads a TOML file, points its ``model_args`` at ``--model``, places its model stages
(:func:`apply_placement`, ``--device``/``--dtype``), applies the overrides, builds and validates
(:func:`omnitrio.config.validate`).
"""

from __future__ import annotations

import inspect
import json
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import msgspec

from omnitrio.config import DEFAULT_MODEL_ARGS, EndpointsConfig, PipelineConfig, StageConfig, validate
from omnitrio.errors import ConfigError
from omnitrio.importing import ImportPathError, import_object

_PIPELINE_KEYS = {f.name for f in attrs.fields(PipelineConfig)}
_STAGE_KEYS = {f.name for f in attrs.fields(StageConfig)}


def _plain_data_schema(cls: type, types: Mapping[str, Any], skip: Iterable[str] = ()) -> type[msgspec.Struct]:
    """A msgspec Struct with the fields and types of the attrs class ``cls``, to check plain
    data (parsed TOML) with errors that name the field; ``types`` replaces a field's type
    with the plain form the data holds.  Only fields present in the data are read back."""
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for f in attrs.fields(attrs.resolve_types(cls)):
        if f.name in skip:
            continue
        kind = types.get(f.name, f.type)
        fields.append((f.name, kind) if f.default is attrs.NOTHING else (f.name, kind, None))
    return msgspec.defstruct(f"{cls.__name__}Data", fields, forbid_unknown_fields=True)


_StageFields = _plain_data_schema(StageConfig, {"factory": dict[str, Any] | None})
_PipelineFields = _plain_data_schema(PipelineConfig, {"endpoints": Any}, skip=("stages",))


def from_dict(raw: Mapping[str, Any]) -> PipelineConfig:
    """Build a :class:`PipelineConfig` from plain data (parsed TOML or JSON).

    Unknown keys and wrong types are errors that name where they are.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"a pipeline config must be a table, got {type(raw).__name__}")
    unknown = sorted(set(raw) - _PIPELINE_KEYS)
    if unknown:
        raise ConfigError(f"unknown pipeline field(s) {unknown}; known: {sorted(_PIPELINE_KEYS)}")
    stages_raw = raw.get("stages")
    if not isinstance(stages_raw, list) or not stages_raw:
        raise ConfigError("stages: a pipeline needs at least one [[stages]] table")
    stages = [_stage_from_dict(i, s) for i, s in enumerate(stages_raw)]
    fields = {k: v for k, v in raw.items() if k != "stages"}
    if isinstance(fields.get("endpoints"), Mapping):
        fields["endpoints"] = EndpointsConfig(**fields["endpoints"])
    try:
        typed = msgspec.convert(fields, _PipelineFields, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"pipeline: {exc}") from None
    return PipelineConfig(stages=stages, **{k: getattr(typed, k) for k in fields})


def _stage_from_dict(index: int, raw: Any) -> StageConfig:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"stages[{index}]: expected a table, got {type(raw).__name__}")
    label = f"stages[{index}] ({raw.get('name')!r})"
    unknown = sorted(set(raw) - _STAGE_KEYS)
    if unknown:
        raise ConfigError(f"{label}: unknown field(s) {unknown}")
    try:
        typed = msgspec.convert(dict(raw), _StageFields, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{label}: {exc}") from None
    return StageConfig(**{k: getattr(typed, k) for k in raw})


def load(
    path: str | Path,
    overrides: Iterable[str] = (),
    model: str | Path | None = None,
    *,
    device: str | None = None,
    dtype: str | None = None,
    process_factories: bool = True,
) -> PipelineConfig:
    """Load a TOML pipeline file, point its ``model_args`` at ``model`` (when given), place its stages
    on ``device`` in ``dtype`` (when given, :func:`apply_placement`), apply the ``key.path=value``
    overrides (last, so a stage's own ``--set`` wins), then validate (``process_factories``: see
    :func:`~omnitrio.config.validate`)."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    if model is not None:
        targets = raw.get("model_args", list(DEFAULT_MODEL_ARGS))
        if not isinstance(targets, list) or not all(isinstance(t, str) and "." in t for t in targets):
            raise ConfigError(f"model_args: must be a list of 'stage.factory.field' strings, got {targets!r}")
        for target in targets:
            apply_override(raw, f"{target}={json.dumps(str(Path(model).resolve()))}")
        if raw.get("name_from_model") is True:
            raw["name"] = Path(model).resolve().name
    apply_placement(raw, device=device, dtype=dtype)
    for item in overrides:
        apply_override(raw, item)
    config = from_dict(raw)
    validate(config, process_factories=process_factories)
    return config


def process_factory_paths(path: str | Path, overrides: Iterable[str] = ()) -> list[str]:
    """The ``factory_path`` of every stage the TOML pipeline file at ``path`` (with ``overrides``) runs
    in a process of its own on this machine, read without importing anything: what a fork server can
    start preloading before :func:`load`.  Empty for a Ray placement, and for a file :func:`load`
    refuses (it says why)."""
    try:
        raw = tomllib.loads(Path(path).read_text())
        for item in overrides:
            apply_override(raw, item)
    except (OSError, tomllib.TOMLDecodeError, ConfigError):
        return []
    stages = raw.get("stages")
    if raw.get("placement", "local") != "local" or not isinstance(stages, list):
        return []
    return [
        stage["factory_path"]
        for stage in stages
        if isinstance(stage, dict) and stage.get("process") and isinstance(stage.get("factory_path"), str)
    ]


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply one ``key.path=value`` override to raw config data, in place.

    The first component is a pipeline field or a stage name (``encoder.factory.max_batch_wait_ms=0``).
    The value is read as a TOML value (``true``, ``3``, ``"text"``, ``[1, 2]``) and falls
    back to a plain string.
    """
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} must look like key.path=value")
    parts = [p.strip() for p in key.strip().split(".")]
    try:
        value: Any = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    stages = raw.get("stages") or []
    target: dict[str, Any]
    by_name = {s.get("name"): s for s in stages if isinstance(s, dict)}
    if parts[0] in by_name and len(parts) > 1:
        target, parts = by_name[parts[0]], parts[1:]
    elif parts[0] in _PIPELINE_KEYS and parts[0] != "stages":
        target = raw
    else:
        raise ConfigError(f"override {item!r}: {parts[0]!r} is neither a stage nor a pipeline field")
    for part in parts[:-1]:
        child = target.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: {part!r} is not a table")
        target = child
    target[parts[-1]] = value


PLACEMENT_ARGS = ("device", "dtype")
"""The factory arguments ``--device`` and ``--dtype`` set (``schedulers.devices`` reads them)."""


def apply_placement(raw: dict[str, Any], *, device: str | None = None, dtype: str | None = None) -> None:
    """Set ``device`` and ``dtype`` (those given) in the ``factory`` table of every stage whose factory
    function has a parameter of that name, in place: one flag places every model stage of a pipeline,
    whatever the family.  Values are checked by the stages (``omnitrio check`` asks them); a flag no
    factory of the pipeline takes is a :class:`ConfigError`.  Factories are imported by their dotted path
    (as validation does) to read their signatures."""
    given = {name: value for name, value in zip(PLACEMENT_ARGS, (device, dtype), strict=True) if value is not None}
    if not given:
        return
    placed: dict[str, list[str]] = {name: [] for name in given}
    for index, stage in enumerate(raw.get("stages") or []):
        if not isinstance(stage, dict) or not isinstance(stage.get("factory_path"), str):
            continue  # from_dict names what is wrong with it
        try:
            factory = import_object(stage["factory_path"])
        except ImportPathError as exc:
            raise ConfigError(f"stages[{index}] ({stage.get('name')!r}): factory_path: {exc}") from None
        taken = _named_parameters(factory)
        for name, value in given.items():
            if name in taken:
                factory_args = stage.setdefault("factory", {})
                if not isinstance(factory_args, dict):
                    raise ConfigError(f"stages[{index}] ({stage.get('name')!r}): factory: expected a table")
                factory_args[name] = value
                placed[name].append(str(stage.get("name")))
    for name, stages in placed.items():
        if not stages:
            raise ConfigError(f"--{name}: no stage of this pipeline takes a {name!r} factory argument")


def _named_parameters(factory: Any) -> set[str]:
    """The parameters ``factory`` accepts by name (none for a ``**kwargs`` catch-all or no signature)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
