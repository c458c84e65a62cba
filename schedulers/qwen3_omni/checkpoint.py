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
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from schedulers import checkpoints
from schedulers.checkpoints import CheckpointError
from schedulers.checkpoints import require_model_dir as require_model_dir
from schedulers.front.towers import thinker_widths
from schedulers.library_noise import silence

MODEL_TYPE = "qwen3_omni_moe"
FAMILY = "Qwen3-Omni"
PARTS = ("thinker.", "talker.", "code2wav.")


MROPE_KEYS = frozenset({"mrope_section", "interleaved"})
ROPE_CHECK = "Unrecognized keys in `rope_parameters` for 'rope_type'='default': "


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


def load_weights(model_dir: str | Path, prefix: str, module: torch.nn.Module) -> None:
    """Load every tensor named ``prefix...`` into ``module`` (``prefix`` stripped), strictly.

    Only the shards the index lists for ``prefix`` are opened.  MoE experts stored one by one, as
    released, are fused into the module's ``experts.gate_up_proj`` / ``experts.down_proj``.  A tensor
    missing from the checkpoint or one ``module`` has no place for raises :class:`CheckpointError`.
    Each tensor takes the dtype of the module's own and is assigned (``load_state_dict(assign=True)``),
    so ``module`` may be built on CPU or on the ``meta`` device; buffers outside the state dict (rotary
    frequencies and the like) stay as the module built them: on ``meta`` they stay on ``meta``.
    """
    where = f"{checkpoints.index_path(Path(model_dir))} under {prefix!r}"
    raw = checkpoints.read_tensors(model_dir, prefix)
    _check_experts(raw, where)
    checkpoints.assign(module, _fuse_experts(raw), where)


# A released checkpoint stores each MoE expert's projections apart (``...experts.3.gate_proj.weight``);
# transformers' modules hold them fused per layer: ``experts.gate_up_proj`` [E, 2I, H] (every expert's
# gate rows, then its up rows) and ``experts.down_proj`` [E, H, I] (its ``qwen2_moe`` conversion).
_EXPERT = re.compile(r"^(?P<base>.*\.experts)\.(?P<index>\d+)\.(?P<kind>gate|up|down)_proj\.weight$")


def _check_experts(names: Iterable[str], where: str) -> None:
    """Each fused layer's experts have all three projections, numbered 0..N-1 alike (else named)."""
    experts: dict[tuple[str, str], set[int]] = {}
    for name in names:
        match = _EXPERT.match(name)
        if match is not None:
            experts.setdefault((match["base"], match["kind"]), set()).add(int(match["index"]))
    counts = {base: indices for (base, _), indices in experts.items()}
    for base in counts:
        if any((base, kind) not in experts for kind in ("gate", "up", "down")):
            raise CheckpointError(f"{where}: the experts of {base!r} lack one of gate_proj, up_proj, down_proj")
    for (base, kind), indices in experts.items():
        if indices != set(range(len(indices))) or indices != counts[base]:
            raise CheckpointError(f"{where}: the experts of {base!r} ({kind}_proj) are not numbered 0..N-1 alike")


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


def _check_consistency(config: Any, path: Path) -> None:
    """The cross-part rules whose breach transformers does not report (or reports deep in a forward)."""
    thinker, talker, code2wav = config.thinker_config, config.talker_config, config.code2wav_config
    thinker_width = ("talker_config.thinker_hidden_size", talker.thinker_hidden_size)
    checkpoints.check_equal(path, *thinker_widths(thinker), thinker_width)
    if not config.enable_audio_output:
        return
    checkpoints.check_equal(
        path,
        ("talker_config.num_code_groups", talker.num_code_groups),
        ("talker_config.code_predictor_config.num_code_groups", talker.code_predictor_config.num_code_groups),
        ("code2wav_config.num_quantizers", code2wav.num_quantizers),
    )
    checkpoints.check_equal(
        path,
        ("talker_config.code_predictor_config.vocab_size", talker.code_predictor_config.vocab_size),
        ("code2wav_config.codebook_size", code2wav.codebook_size),
    )
    checkpoints.check_equal(
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


def speakers(config: Any) -> dict[str, int]:
    """The checkpoint's speakers: lower-case name → talker codec id."""
    return {str(name).lower(): int(codec_id) for name, codec_id in (config.talker_config.speaker_id or {}).items()}


def _config_class() -> Any:
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeConfig

    return Qwen3OmniMoeConfig


CHECKPOINT = checkpoints.Family(MODEL_TYPE, FAMILY, PARTS, _config_class, _check_consistency)
load_config = CHECKPOINT.load_config
check_checkpoint = CHECKPOINT.check_checkpoint
preflight = CHECKPOINT.preflight
