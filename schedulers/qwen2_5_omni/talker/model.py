"""The Qwen2.5-Omni talker: transformers' ``Qwen2_5OmniTalkerForConditionalGeneration`` and the thinker
embedding rows its input needs.

:class:`TalkerModel` holds the talker (``thinker_to_talker_proj``, the Qwen2 model over codec ids,
``codec_head``) with the checkpoint's ``talker.`` weights, and the rows of the thinker's token embedding
that ``generate`` feeds it besides the thinker's stream: each speaker's ``bos_token`` row,
``<tts_text_eod>`` and ``<tts_text_pad>`` (read by slice from the shard that holds the embedding; the stage
never holds the thinker).

Inputs are in the thinker's width (what ``generate`` sums: thinker states, thinker embeddings, codec
embeddings); :meth:`TalkerModel.forward` projects them and steps the model, so any rows of a batch step
through transformers' ``Cache`` interface.  Positions are ``[3, B, S]``, one row per rope axis.  Logits
come back float32, as the talker's forward returns them.  One thread at a time; every call runs under
``torch.inference_mode``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
    Qwen2_5OmniTalkerForConditionalGeneration,
)

from schedulers import checkpoints
from schedulers.devices import build
from schedulers.engine.kv_batch import cached_forward
from schedulers.qwen2_5_omni.checkpoint import load_config, load_weights, speakers

TALKER_PREFIX = "talker."
EMBED_KEY = "thinker.model.embed_tokens.weight"


class TalkerModel:
    """The talker module and its thinker rows (module docstring); ``speaker_rows`` by speaker name."""

    def __init__(
        self, config: Any, talker: Any, eod: torch.Tensor, pad: torch.Tensor, speaker_rows: Mapping[str, torch.Tensor]
    ) -> None:
        self.config = config
        self.talker: Any = talker.eval()
        dtype, device = self.dtype, self.device
        self.text_eod = eod.to(device, dtype)
        self.text_pad = pad.to(device, dtype)
        self.speaker_rows = {name: row.to(device, dtype) for name, row in speaker_rows.items()}
        talker_config = config.talker_config
        self.codec_pad = int(talker_config.tts_codec_pad_token_id)
        self.codec_bos = int(talker_config.tts_codec_start_token_id)
        self.codec_end = int(talker_config.tts_codec_end_token_id)
        self.codec_mask = int(talker_config.tts_codec_mask_token_id)
        thinker = config.thinker_config
        self.media_ids = (thinker.audio_token_index, thinker.image_token_index, thinker.video_token_index)

    @classmethod
    def from_checkpoint(
        cls, model_dir: str | Path, *, device: str = "cpu", dtype: torch.dtype = torch.float32
    ) -> TalkerModel:
        """Build in ``dtype`` without initialising weights, fill from ``talker.`` and the thinker rows, move
        to ``device``."""
        config = load_config(model_dir)
        talker = build(Qwen2_5OmniTalkerForConditionalGeneration, config.talker_config, dtype)  # beside other builds
        load_weights(model_dir, TALKER_PREFIX, talker)
        voices = speakers(model_dir)
        ids = [config.talker_config.tts_text_end_token_id, config.talker_config.tts_text_pad_token_id]
        rows = read_rows(model_dir, EMBED_KEY, [*ids, *(voices[name].bos_token for name in voices)])
        named = dict(zip(voices, rows[2:], strict=True))
        return cls(config, talker.to(device), rows[0], rows[1], named)

    @classmethod
    def from_model(cls, model: Any) -> TalkerModel:
        """Share the talker of an in-memory ``Qwen2_5OmniForConditionalGeneration`` (tests)."""
        embed = model.thinker.get_input_embeddings().weight
        talker_config = model.config.talker_config
        rows = {name: embed[int(entry["bos_token"])].detach() for name, entry in model.speaker_map.items()}
        eod, pad = embed[talker_config.tts_text_end_token_id], embed[talker_config.tts_text_pad_token_id]
        return cls(model.config, model.talker, eod.detach(), pad.detach(), rows)

    @property
    def dtype(self) -> torch.dtype:
        return self.talker.codec_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.talker.codec_head.weight.device

    @property
    def num_layers(self) -> int:
        return int(self.config.talker_config.num_hidden_layers)

    def codec_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The talker's codec embedding of ``ids`` (any shape) → ``[..., H_thinker]``."""
        with torch.inference_mode():
            return self.talker.get_input_embeddings()(ids.to(self.device))

    def forward(
        self,
        embeds: torch.Tensor,
        position_ids: torch.Tensor,
        cache: Any,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One forward of ``embeds [B, S, H_thinker]`` at ``position_ids [3, B, S]``; ``cache`` grows by ``S``
        columns per row; ``attention_mask [B, past + S]`` marks padding with 0 (None: no padding).  Returns
        the float32 codec logits of the last position, ``[B, V]``."""
        mask = None if attention_mask is None else attention_mask.to(self.device)
        with torch.inference_mode():
            projected = self.talker.thinker_to_talker_proj(embeds.to(self.device, self.dtype))
            out = cached_forward(self.talker.model, projected, position_ids.to(self.device), mask, cache)
            return self.talker.codec_head(out.last_hidden_state[:, -1]).float()


def read_rows(model_dir: str | Path, key: str, rows: list[int]) -> torch.Tensor:
    """Rows ``rows`` of tensor ``key`` (float32 ``[len(rows), D]``), read by slice from the shard that holds
    it; a CheckpointError naming the file when the index has no such tensor."""
    directory = checkpoints.directory(model_dir)
    shard = checkpoints.weight_map(directory).get(key)
    if shard is None:
        raise checkpoints.CheckpointError(f"{checkpoints.index_path(directory)}: no tensor {key!r}")
    with safe_open(str(directory / shard), framework="pt") as handle:
        view = handle.get_slice(key)
        return torch.cat([view[row : row + 1] for row in rows]).float()
