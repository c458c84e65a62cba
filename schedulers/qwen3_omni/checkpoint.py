"""Read a Qwen3-Omni checkpoint directory: its configuration, a check without weights, one part's weights.

The layout is the one ``Qwen3OmniMoeForConditionalGeneration.save_pretrained`` and the processor write (the
released checkpoint's): ``config.json`` (``model_type`` ``qwen3_omni_moe``), safetensors shards listed in
``model.safetensors.index.json`` (or one ``model.safetensors``), the tokenizer, ``preprocessor_config.json``
and a chat template.  Every error is a :class:`CheckpointError` whose message names the file and what is
wrong with it.

* :func:`load_config` parses and checks ``config.json`` (no weights read);
* :func:`check_checkpoint` also checks every file a stage reads: each shard the index lists exists and holds
  the tensors the index says it holds (only the safetensors headers are read), the tokenizer, processor
  configuration and chat template are present;
* :func:`load_weights` loads the tensors under one prefix (``"thinker.audio_tower."``, ``"talker."``,
  ``"code2wav."``, ...) into a module, reading only the shards that hold them.

Importing it silences one known-harmless transformers warning (:func:`mrope_keys_only`): its rope check
does not know the keys Qwen3-Omni's multimodal rotary embedding reads.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from schedulers.devices import check_placement
from schedulers.library_noise import silence

MODEL_TYPE = "qwen3_omni_moe"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
CHAT_TEMPLATE_FILES = ("chat_template.json", "chat_template.jinja")
PREPROCESSOR_FILE = "preprocessor_config.json"
PARTS = ("thinker.", "talker.", "code2wav.")


MROPE_KEYS = frozenset({"mrope_section", "interleaved"})
ROPE_CHECK = "Unrecognized keys in `rope_parameters` for 'rope_type'='default': "


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be served; the message names the file and the fault."""


def mrope_keys_only(message: str) -> bool:
    """Whether ``message`` is transformers' rope check naming only :data:`MROPE_KEYS` as unknown keys."""
    if not message.startswith(ROPE_CHECK):
        return False
    try:
        keys = ast.literal_eval(message.removeprefix(ROPE_CHECK))
    except (ValueError, SyntaxError):
        return False
    return isinstance(keys, set) and keys <= MROPE_KEYS


silence("transformers.modeling_rope_utils", mrope_keys_only)


def require_model_dir(model_dir: str | Path | None) -> str:
    """``model_dir`` as a string, or a :class:`CheckpointError` saying how to set it."""
    if model_dir is None or not str(model_dir):
        raise CheckpointError("model_dir: not set; pass the checkpoint directory (serve --model DIR)")
    return str(model_dir)


def preflight(*, model_dir: str | None = None, **factory_args: Any) -> None:
    """What ``omnitrio check`` runs for a stage reading this checkpoint: its ``device`` and ``dtype``
    (:func:`schedulers.devices.check_placement`), then :func:`check_checkpoint`."""
    check_placement(**factory_args)
    check_checkpoint(require_model_dir(model_dir))


def load_config(model_dir: str | Path) -> Any:
    """``Qwen3OmniMoeConfig`` from ``model_dir/config.json``, its parts checked for consistency (no weights)."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeConfig

    path = _directory(model_dir) / "config.json"
    raw = _read_json(path)
    if raw.get("model_type") != MODEL_TYPE:
        raise CheckpointError(f"{path}: model_type is {raw.get('model_type')!r}, not {MODEL_TYPE!r} (Qwen3-Omni)")
    try:
        config = Qwen3OmniMoeConfig.from_dict(raw)
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{path}: not a valid Qwen3-Omni configuration ({exc})") from None
    _check_consistency(config, path)
    return config


def check_checkpoint(model_dir: str | Path) -> None:
    """Everything :func:`load_config` checks, plus the files the stages read (module docstring)."""
    directory = _directory(model_dir)
    config = load_config(directory)
    weight_map = _weight_map(directory)
    for shard, keys in _keys_by_shard(weight_map).items():
        held = set(_shard_keys(directory / shard))
        missing = sorted(set(keys) - held)
        if missing:
            raise CheckpointError(
                f"{directory / shard}: the index ({INDEX_FILE}) lists {len(missing)} tensors this shard does not "
                f"hold, e.g. {missing[0]!r}"
            )
    parts = PARTS if config.enable_audio_output else PARTS[:1]
    for part in parts:
        if not any(key.startswith(part) for key in weight_map):
            raise CheckpointError(f"{_index_name(directory)}: no tensors of {part.rstrip('.')!r}")
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise CheckpointError(f"{directory}: no tokenizer ({' or '.join(TOKENIZER_FILES)})")
    _read_json(directory / PREPROCESSOR_FILE)
    if not any((directory / name).is_file() for name in CHAT_TEMPLATE_FILES):
        raise CheckpointError(f"{directory}: no chat template ({' or '.join(CHAT_TEMPLATE_FILES)})")


def load_weights(model_dir: str | Path, prefix: str, module: torch.nn.Module) -> None:
    """Load every tensor named ``prefix...`` into ``module`` (``prefix`` stripped), strictly.

    Only the shards the index lists for ``prefix`` are opened.  MoE experts stored one by one, as
    released, are fused into the module's ``experts.gate_up_proj`` / ``experts.down_proj``.  A tensor
    missing from the checkpoint or one ``module`` has no place for raises :class:`CheckpointError`.
    Each tensor takes the dtype of the module's own and is assigned (``load_state_dict(assign=True)``),
    so ``module`` may be built on CPU or on the ``meta`` device; buffers outside the state dict (rotary
    frequencies and the like) stay as the module built them: on ``meta`` they stay on ``meta``.
    """
    from safetensors import safe_open

    directory = _directory(model_dir)
    weight_map = _weight_map(directory)
    wanted = {key: shard for key, shard in weight_map.items() if key.startswith(prefix)}
    if not wanted:
        raise CheckpointError(f"{_index_name(directory)}: no tensors under {prefix!r}")
    expected = module.state_dict()
    names = _module_names([key[len(prefix) :] for key in wanted], f"{_index_name(directory)}")
    missing, unexpected = sorted(set(expected) - names), sorted(names - set(expected))
    if missing or unexpected:
        what = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        raise CheckpointError(
            f"{_index_name(directory)}: tensors under {prefix!r} do not match {type(module).__name__} ({what})"
        )
    raw: dict[str, torch.Tensor] = {}
    for shard, keys in _keys_by_shard(wanted).items():
        path = directory / shard
        try:
            with safe_open(str(path), framework="pt") as handle:
                held = set(handle.keys())
                for key in keys:
                    if key not in held:
                        raise CheckpointError(f"{path}: the index lists {key!r} here but the shard does not hold it")
                    raw[key[len(prefix) :]] = handle.get_tensor(key)
        except (OSError, RuntimeError) as exc:
            raise CheckpointError(f"{path}: cannot read this shard ({exc})") from None
    state = {name: tensor.to(expected[name].dtype) for name, tensor in _fuse_experts(raw).items()}
    module.load_state_dict(state, strict=True, assign=True)


# A released checkpoint stores each MoE expert's projections apart (``...experts.3.gate_proj.weight``);
# transformers' modules hold them fused per layer: ``experts.gate_up_proj`` [E, 2I, H] (every expert's
# gate rows, then its up rows) and ``experts.down_proj`` [E, H, I] (its ``qwen2_moe`` conversion).
_EXPERT = re.compile(r"^(?P<base>.*\.experts)\.(?P<index>\d+)\.(?P<kind>gate|up|down)_proj\.weight$")


def _module_names(names: Iterable[str], where: str) -> set[str]:
    """The module's state-dict names for checkpoint tensor names (experts fused); checks expert numbering."""
    result: set[str] = set()
    experts: dict[tuple[str, str], set[int]] = {}
    for name in names:
        match = _EXPERT.match(name)
        if match is None:
            result.add(name)
            continue
        kind = "down_proj" if match["kind"] == "down" else "gate_up_proj"
        result.add(f"{match['base']}.{kind}")
        experts.setdefault((match["base"], match["kind"]), set()).add(int(match["index"]))
    counts = {base: indices for (base, _), indices in experts.items()}
    for base in counts:
        if any((base, kind) not in experts for kind in ("gate", "up", "down")):
            raise CheckpointError(f"{where}: the experts of {base!r} lack one of gate_proj, up_proj, down_proj")
    for (base, kind), indices in experts.items():
        if indices != set(range(len(indices))) or indices != counts[base]:
            raise CheckpointError(f"{where}: the experts of {base!r} ({kind}_proj) are not numbered 0..N-1 alike")
    return result


def _fuse_experts(raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``raw`` with per-expert projections replaced by the fused tensors (see :data:`_EXPERT`)."""
    state: dict[str, torch.Tensor] = {}
    parts: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    for name, tensor in raw.items():
        match = _EXPERT.match(name)
        if match is None:
            state[name] = tensor
        else:
            parts.setdefault(match["base"], {}).setdefault(match["kind"], {})[int(match["index"])] = tensor
    for base, kinds in parts.items():

        def stacked(kind: str, kinds: dict[str, dict[int, torch.Tensor]] = kinds) -> torch.Tensor:
            return torch.stack([kinds[kind][i] for i in range(len(kinds[kind]))])

        if "gate" in kinds or "up" in kinds:
            state[f"{base}.gate_up_proj"] = torch.cat([stacked("gate"), stacked("up")], dim=1)
        if "down" in kinds:
            state[f"{base}.down_proj"] = stacked("down")
    return state


def _directory(model_dir: str | Path) -> Path:
    directory = Path(model_dir)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a checkpoint directory (does not exist or is not a directory)")
    return directory


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _index_name(directory: Path) -> Path:
    return directory / INDEX_FILE if (directory / INDEX_FILE).is_file() else directory / SINGLE_FILE


def _weight_map(directory: Path) -> dict[str, str]:
    """Tensor name → shard file name, from the index (or the single ``model.safetensors``)."""
    index = directory / INDEX_FILE
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: no 'weight_map' (tensor name -> shard file)")
        for shard in set(weight_map.values()):
            if not isinstance(shard, str) or Path(shard).name != shard:
                raise CheckpointError(f"{index}: {shard!r} is not a shard file name in this directory")
            if not (directory / shard).is_file():
                raise CheckpointError(f"{directory / shard}: missing (listed in {INDEX_FILE})")
        return weight_map
    single = directory / SINGLE_FILE
    if single.is_file():
        return dict.fromkeys(_shard_keys(single), SINGLE_FILE)
    raise CheckpointError(f"{index}: missing (and no single {SINGLE_FILE})")


def _shard_keys(path: Path) -> list[str]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            return list(handle.keys())
    except (OSError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None


def _keys_by_shard(weight_map: dict[str, str]) -> dict[str, list[str]]:
    shards: dict[str, list[str]] = {}
    for key, shard in weight_map.items():
        shards.setdefault(shard, []).append(key)
    return shards


def _check_consistency(config: Any, path: Path) -> None:
    """The cross-part rules whose breach transformers does not report (or reports deep in a forward)."""
    thinker, talker, code2wav = config.thinker_config, config.talker_config, config.code2wav_config
    hidden = thinker.text_config.hidden_size
    _same(
        path,
        ("thinker_config.text_config.hidden_size", hidden),
        ("thinker_config.audio_config.output_dim", thinker.audio_config.output_dim),
        ("thinker_config.vision_config.out_hidden_size", thinker.vision_config.out_hidden_size),
        ("talker_config.thinker_hidden_size", talker.thinker_hidden_size),
    )
    if not config.enable_audio_output:
        return
    _same(
        path,
        ("talker_config.num_code_groups", talker.num_code_groups),
        ("talker_config.code_predictor_config.num_code_groups", talker.code_predictor_config.num_code_groups),
        ("code2wav_config.num_quantizers", code2wav.num_quantizers),
    )
    _same(
        path,
        ("talker_config.code_predictor_config.vocab_size", talker.code_predictor_config.vocab_size),
        ("code2wav_config.codebook_size", code2wav.codebook_size),
    )
    _same(
        path,
        ("talker_config.code_predictor_config.hidden_size", talker.code_predictor_config.hidden_size),
        ("talker_config.text_config.hidden_size", talker.text_config.hidden_size),
    )
    if talker.accept_hidden_layer > thinker.text_config.num_hidden_layers:
        raise CheckpointError(
            f"{path}: talker_config.accept_hidden_layer {talker.accept_hidden_layer} exceeds the thinker's "
            f"{thinker.text_config.num_hidden_layers} layers"
        )
    speakers = talker.speaker_id
    if not isinstance(speakers, dict) or not speakers:
        raise CheckpointError(f"{path}: talker_config.speaker_id must map speaker names to codec ids")
    vocab = talker.text_config.vocab_size
    for name, codec_id in speakers.items():
        if not isinstance(codec_id, int) or not 0 <= codec_id < vocab:
            raise CheckpointError(f"{path}: talker_config.speaker_id[{name!r}] = {codec_id!r} is not a talker id")


def _same(path: Path, *fields: tuple[str, Any]) -> None:
    values: Iterable[Any] = (value for _, value in fields)
    if len(set(values)) > 1:
        listed = ", ".join(f"{name} = {value}" for name, value in fields)
        raise CheckpointError(f"{path}: these must be equal: {listed}")


def speakers(config: Any) -> dict[str, int]:
    """The checkpoint's speakers: lower-case name → talker codec id."""
    return {str(name).lower(): int(codec_id) for name, codec_id in (config.talker_config.speaker_id or {}).items()}
