"""The talker's weights and its two forwards (prefill one request, decode a batch), transformers' classes.

:class:`TalkerModel` holds ``Qwen3OmniMoeTalkerForConditionalGeneration`` (its ``model``,
``codec_head``, ``text_projection``, ``hidden_projection`` and ``code_predictor``) and the three
projected thinker specials ``tts_bos``, ``tts_eos``, ``tts_pad``
(``text_projection(thinker.embed_tokens([bos, eos, pad]))``, as ``generate`` builds them).  It loads
only ``talker.`` weights and the three rows of ``thinker.model.embed_tokens.weight`` it needs (read by
slice from the shard the index names), so the stage never holds the thinker.

Every call runs under ``torch.inference_mode`` and is deterministic for given inputs; the module is
used from one thread (the scheduler's).  Logits come back float32 as ``generate`` reads them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import torch
from safetensors import safe_open
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeRotaryEmbedding,
    Qwen3OmniMoeTalkerForConditionalGeneration,
    Qwen3OmniMoeTalkerRotaryEmbedding,
)

from schedulers.devices import build
from schedulers.engine.kv_batch import cached_forward
from schedulers.qwen3_omni.checkpoint import CheckpointError, load_config, load_weights

EMBED_KEY = "thinker.model.embed_tokens.weight"


@attrs.frozen
class TokenIds:
    """The ids the talker prompt is built from (the checkpoint's config)."""

    im_start: int
    user: int
    assistant: int
    multimodal: tuple[int, ...]
    tts_pad: int
    codec_nothink: int
    codec_think_bos: int
    codec_think_eos: int
    codec_pad: int
    codec_bos: int
    codec_eos: int
    speakers: dict[str, int]

    @classmethod
    def of(cls, config: Any) -> TokenIds:
        thinker, talker = config.thinker_config, config.talker_config
        return cls(
            im_start=config.im_start_token_id,
            user=config.user_token_id,
            assistant=config.assistant_token_id,
            multimodal=(thinker.audio_token_id, thinker.image_token_id, thinker.video_token_id),
            tts_pad=config.tts_pad_token_id,
            codec_nothink=talker.codec_nothink_id,
            codec_think_bos=talker.codec_think_bos_id,
            codec_think_eos=talker.codec_think_eos_id,
            codec_pad=talker.codec_pad_id,
            codec_bos=talker.codec_bos_id,
            codec_eos=talker.codec_eos_token_id,
            speakers={str(k).lower(): int(v) for k, v in (talker.speaker_id or {}).items()},
        )


class TalkerModel:
    """The talker module plus the projected tts specials; see the module docstring."""

    def __init__(self, config: Any, talker: Any, tts_rows: torch.Tensor) -> None:
        self.config = config
        self.talker: Any = talker.eval()
        self.ids = TokenIds.of(config)
        # A prompt with audio and an image needs the audio config in the talker's (get_rope_index).
        if getattr(self.talker.config, "audio_config", None) is None:
            self.talker.config.audio_config = config.thinker_config.audio_config
        with torch.inference_mode():
            projected = self.talker.text_projection(tts_rows.to(self.device, self.dtype).unsqueeze(0))[0]
        self.tts_bos, self.tts_eos, self.tts_pad = projected[0], projected[1], projected[2]

    @property
    def dtype(self) -> torch.dtype:
        return next(self.talker.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.talker.parameters()).device

    @property
    def num_code_groups(self) -> int:
        return int(self.config.talker_config.num_code_groups)

    @property
    def vocab_size(self) -> int:
        return int(self.config.talker_config.text_config.vocab_size)

    @classmethod
    def from_full_model(cls, model: Any) -> TalkerModel:
        """Share the talker of an in-memory ``Qwen3OmniMoeForConditionalGeneration`` (tests)."""
        ids = torch.tensor(
            [model.config.tts_bos_token_id, model.config.tts_eos_token_id, model.config.tts_pad_token_id]
        )
        with torch.inference_mode():
            rows = model.thinker.get_input_embeddings()(ids)
        return cls(model.config, model.talker, rows)

    @classmethod
    def from_checkpoint(
        cls, model_dir: str | Path, *, dtype: torch.dtype = torch.float32, device: str = "cpu"
    ) -> TalkerModel:
        """Build the talker on the meta device, fill it with the ``talker.`` weights and the three tts rows,
        recompute its rotary frequencies (not weights), then move it to ``device``.

        Raises the checkpoint reader's error (naming the file) when a tensor is missing or left unfilled.
        """
        config = load_config(model_dir)
        with torch.device("meta"):
            talker = build(Qwen3OmniMoeTalkerForConditionalGeneration, config.talker_config, dtype)
        load_weights(model_dir, "talker.", talker)
        talker.model.rotary_emb = Qwen3OmniMoeTalkerRotaryEmbedding(talker.model.config)
        predictor = talker.code_predictor.model
        predictor.rotary_emb = Qwen3OmniMoeRotaryEmbedding(config=predictor.config)
        unfilled = [name for name, tensor in [*talker.named_parameters(), *talker.named_buffers()] if tensor.is_meta]
        if unfilled:
            raise CheckpointError(f"{model_dir}: the talker's {unfilled[:5]} were not filled from the checkpoint")
        rows = read_rows(
            Path(model_dir), EMBED_KEY, [config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]
        )
        return cls(config, talker.to(device), rows)  # parameters are in dtype already; rotary stays float32

    # -- forwards ---------------------------------------------------------------------

    def project_text(self, embeds: torch.Tensor) -> torch.Tensor:
        """``text_projection`` of thinker token embeddings ``[n, H_thinker]`` → ``[n, H]``."""
        with torch.inference_mode():
            return self.talker.text_projection(embeds.to(self.device, self.dtype).unsqueeze(0))[0]

    def project_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden_projection`` of thinker hidden states ``[n, H_thinker]`` → ``[n, H]``."""
        with torch.inference_mode():
            return self.talker.hidden_projection(hidden.to(self.device, self.dtype).unsqueeze(0))[0]

    def codec_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The talker's codec embedding of ``ids`` (any shape) → ``[..., H]``."""
        with torch.inference_mode():
            return self.talker.get_input_embeddings()(ids)

    def forward(
        self, embeds: torch.Tensor, position_ids: torch.Tensor, cache: Any, attention_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward of ``embeds [B, S, H]`` at ``position_ids [4, B, S]`` (text row, then mrope rows).

        ``cache`` (a ``DynamicCache``) grows by ``S``; ``attention_mask [B, past + S]`` marks padding
        with 0 (None: no row is padded).  Returns the final hidden state and the float32 codec logits of
        the last position, ``([B, H], [B, V])``; the codec head runs on every position, as the talker's
        forward does.
        """
        with torch.inference_mode():
            out = cached_forward(self.talker.model, embeds, position_ids, attention_mask, cache)
            hidden = out.last_hidden_state
            logits = self.talker.codec_head(hidden)
        return hidden[:, -1], logits[:, -1].float()

    def prompt_positions(
        self,
        talker_ids: torch.Tensor,
        image_grid_thw: torch.Tensor | None,
        audio_feature_lengths: torch.Tensor | None,
    ) -> torch.Tensor:
        """Prefill position ids ``[4, 1, S]`` for ``talker_ids [S]``, as ``generate`` prepares them.

        The text row is ``0..S-1``; the mrope rows come from the talker's ``get_rope_index`` when the
        request carries audio lengths or image grids, else equal the text row.
        """
        length, device = talker_ids.shape[0], talker_ids.device
        image_grid_thw = None if image_grid_thw is None else image_grid_thw.to(device)
        audio_feature_lengths = None if audio_feature_lengths is None else audio_feature_lengths.to(device)
        text = torch.arange(length, device=device).view(1, 1, length)
        has_multimodal = audio_feature_lengths is not None or (
            image_grid_thw is not None and image_grid_thw.numel() > 0
        )
        if not has_multimodal:
            return text.expand(4, 1, length).clone()
        rope, _ = self.talker.get_rope_index(
            talker_ids.view(1, -1),
            image_grid_thw,
            None,
            torch.ones(1, length, dtype=torch.long, device=talker_ids.device),
            False,
            audio_feature_lengths,
            None,
        )
        return torch.cat([text, rope.to(torch.long)], dim=0)


def read_rows(model_dir: Path, key: str, rows: list[int]) -> torch.Tensor:
    """Rows ``rows`` of tensor ``key`` from the shard ``model.safetensors.index.json`` names, read by slice."""
    index_path = model_dir / "model.safetensors.index.json"
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
        shard = model_dir / weight_map[key]
    except (OSError, KeyError, ValueError) as exc:
        raise ValueError(f"{index_path}: cannot find tensor {key!r} ({exc})") from exc
    with safe_open(str(shard), framework="pt") as handle:
        view = handle.get_slice(key)
        return torch.cat([view[row : row + 1] for row in rows]).float()
