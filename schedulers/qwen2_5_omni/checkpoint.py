"""Read a Qwen2.5-Omni checkpoint directory: its configuration, its speakers, a check, one part's weights.

The layout is the release's (``Qwen/Qwen2.5-Omni-7B``): ``config.json`` (``model_type`` ``qwen2_5_omni``),
safetensors shards listed in ``model.safetensors.index.json``, the tokenizer, ``preprocessor_config.json``,
a chat template and ``spk_dict.pt`` (the speakers).  Every error is a
:class:`~schedulers.checkpoints.CheckpointError` whose message names the file and what is wrong with it.

* :func:`load_config` parses and checks ``config.json`` (no weights read);
* :func:`speakers` reads ``spk_dict.pt``: each speaker's talker ``bos_token`` and token2wav conditioning;
* :func:`check_checkpoint` checks everything a stage reads without reading weights: the configuration,
  each shard the index lists (it exists and holds the tensors the index puts in it: headers only), the
  parts, the tokenizer, processor configuration, chat template and speakers;
* :func:`load_weights` loads the tensors under one prefix (``"thinker."``, ``"talker."``,
  ``"token2wav."``, ...) into a module, reading only the shards that hold them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import torch

from schedulers import checkpoints
from schedulers.checkpoints import CheckpointError, require_model_dir
from schedulers.front.towers import thinker_widths
from schedulers.qwen2_5_omni.token2wav.noise import NOISE_BLOCK

MODEL_TYPE = "qwen2_5_omni"
FAMILY = "Qwen2.5-Omni"
SPEAKERS_FILE = "spk_dict.pt"
PARTS = ("thinker.", "talker.", "token2wav.")


def load_weights(model_dir: str | Path, prefix: str, module: torch.nn.Module) -> None:
    """Load every tensor named ``prefix...`` into ``module`` (``prefix`` stripped), strictly, reading only the
    shards that hold them (:func:`schedulers.checkpoints.load_weights`)."""
    checkpoints.load_weights(model_dir, prefix, module)


@attrs.frozen(eq=False)
class Speaker:
    """One voice of ``spk_dict.pt``: the talker's ``bos_token`` (a thinker embedding row) and the DiT's
    conditioning ``cond`` ``[1, D]`` and reference mel ``ref_mel`` ``[1, T, mel_dim]`` (float32)."""

    name: str
    bos_token: int
    cond: torch.Tensor
    ref_mel: torch.Tensor


class Speakers(Mapping[str, Speaker]):
    """The checkpoint's speakers by their names exactly as ``spk_dict.pt`` spells them (case-sensitive, in
    the file's order); :meth:`lookup` also accepts a name in any case.  Read-only."""

    def __init__(self, speakers: Mapping[str, Speaker]) -> None:
        self._speakers = dict(speakers)

    def __getitem__(self, name: str) -> Speaker:
        return self._speakers[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._speakers)

    def __len__(self) -> int:
        return len(self._speakers)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._speakers)

    def lookup(self, name: str) -> Speaker:
        """The speaker called ``name``: its exact spelling first, then ignoring case; a ``KeyError`` that
        lists the speakers otherwise."""
        if name in self._speakers:
            return self._speakers[name]
        folded = [speaker for key, speaker in self._speakers.items() if key.casefold() == name.casefold()]
        if len(folded) == 1:
            return folded[0]
        raise KeyError(f"unknown speaker {name!r}; this checkpoint has {', '.join(self._speakers)}")


def speakers(model_dir: str | Path) -> Speakers:
    """The speakers of ``model_dir/spk_dict.pt``, each checked against the configuration."""
    path = checkpoints.directory(model_dir)
    return _read_speakers(path, load_config(path))


def _read_speakers(model_dir: Path, config: Any) -> Speakers:
    path = model_dir / SPEAKERS_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (the speakers' conditioning)")
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path}: not a readable speaker file ({exc})") from None
    if not isinstance(raw, dict) or not raw:
        raise CheckpointError(f"{path}: expected a dict of speakers {{name: {{bos_token, cond, ref_mel}}}}")
    dit = config.token2wav_config.dit_config
    vocab = config.thinker_config.text_config.vocab_size
    result: dict[str, Speaker] = {}
    for name, entry in raw.items():
        where = f"{path}: speaker {name!r}"
        if not isinstance(entry, dict) or not {"bos_token", "cond", "ref_mel"} <= set(entry):
            raise CheckpointError(f"{where} needs bos_token, cond and ref_mel")
        bos, cond, ref_mel = entry["bos_token"], entry["cond"], entry["ref_mel"]
        bos = int(bos.item()) if isinstance(bos, torch.Tensor) and bos.numel() == 1 else bos
        if isinstance(bos, bool) or not isinstance(bos, int) or not 0 <= bos < vocab:
            raise CheckpointError(f"{where}: bos_token {bos!r} is not a thinker id (vocabulary {vocab})")
        if not isinstance(cond, torch.Tensor) or tuple(cond.shape) != (1, dit.enc_emb_dim):
            raise CheckpointError(f"{where}: cond must be a tensor [1, {dit.enc_emb_dim}] (dit enc_emb_dim)")
        if not isinstance(ref_mel, torch.Tensor) or ref_mel.ndim != 3 or ref_mel.shape[0] != 1:
            raise CheckpointError(f"{where}: ref_mel must be a tensor [1, T, {dit.mel_dim}]")
        if ref_mel.shape[2] != dit.mel_dim or ref_mel.shape[1] < 1:
            raise CheckpointError(f"{where}: ref_mel is {list(ref_mel.shape)}, expected [1, T, {dit.mel_dim}]")
        result[str(name)] = Speaker(str(name), bos, cond.float(), ref_mel.float())
    return Speakers(result)


def _check_consistency(config: Any, path: Path) -> None:
    """The cross-part rules whose breach transformers does not report (or reports deep in a forward)."""
    thinker, talker = config.thinker_config, config.talker_config
    checkpoints.check_equal(path, *thinker_widths(thinker), ("talker_config.embedding_size", talker.embedding_size))
    if not config.enable_audio_output:
        return
    vocab = thinker.text_config.vocab_size
    for name in ("tts_text_start_token_id", "tts_text_end_token_id", "tts_text_pad_token_id"):
        _within(path, f"talker_config.{name}", getattr(talker, name), vocab, "the thinker's vocabulary")
    for name in ("tts_codec_start_token_id", "tts_codec_end_token_id", "tts_codec_pad_token_id"):
        _within(path, f"talker_config.{name}", getattr(talker, name), talker.vocab_size, "the talker's vocabulary")
    _within(path, "talker_config.tts_codec_mask_token_id", talker.tts_codec_mask_token_id, talker.vocab_size, "it")
    dit, bigvgan = config.token2wav_config.dit_config, config.token2wav_config.bigvgan_config
    checkpoints.check_equal(
        path, ("token2wav_config.dit_config.mel_dim", dit.mel_dim), ("bigvgan_config.mel_dim", bigvgan.mel_dim)
    )
    if dit.mel_dim % NOISE_BLOCK:
        raise CheckpointError(
            f"{path}: token2wav_config.dit_config.mel_dim {dit.mel_dim} is not a multiple of {NOISE_BLOCK}: "
            "its noise cannot be drawn frame by frame as transformers draws it whole"
        )
    if dit.block_size % dit.repeats:
        raise CheckpointError(
            f"{path}: token2wav_config.dit_config.block_size {dit.block_size} is not a multiple of repeats "
            f"{dit.repeats} (mel frames per code)"
        )


def _within(path: Path, field: str, value: Any, size: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
        raise CheckpointError(f"{path}: {field} = {value!r} is not inside {what} ({size} ids)")


def _config_class() -> Any:
    from transformers import Qwen2_5OmniConfig

    return Qwen2_5OmniConfig


CHECKPOINT = checkpoints.Family(MODEL_TYPE, FAMILY, PARTS, _config_class, _check_consistency, _read_speakers)
load_config = CHECKPOINT.load_config
check_checkpoint = CHECKPOINT.check_checkpoint
preflight = CHECKPOINT.preflight


__all__ = [
    "CHECKPOINT",
    "FAMILY",
    "MODEL_TYPE",
    "CheckpointError",
    "Speaker",
    "Speakers",
    "check_checkpoint",
    "load_config",
    "load_weights",
    "preflight",
    "require_model_dir",
    "speakers",
]
