"""Qwen3-Omni's audio and image encoders as batched stages (transformers' own towers, their weights only).

* Audio: ``Qwen3OmniMoeAudioEncoder`` with the checkpoint's ``thinker.audio_tower.`` weights.  Input
  :class:`~schedulers.qwen3_omni.handoffs.AudioEncoderInput`; output
  :class:`~schedulers.qwen3_omni.handoffs.AudioEmbeddings`, the clips in order, what
  ``thinker.get_audio_features`` gives for the same inputs.
* Image: ``Qwen3OmniMoeVisionEncoder`` with the ``thinker.visual.`` weights.  Input
  :class:`~schedulers.qwen3_omni.handoffs.ImageEncoderInput`; output
  :class:`~schedulers.qwen3_omni.handoffs.ImageEmbeddings`, as ``get_image_features``.

Requests batch the way SGLang-Omni batches them: *packed*, not padded.  Every clip (image) of every request
in a batch goes into one call along the sequence axis, with its own length (grid) so the towers' attention
stays within each clip's windows (image); the output is split back by token counts.  A batch forms only
from requests already waiting (``batch_wait_when_idle=False``): a lone request never waits for company.
Each stage loads only its tower's weights and runs torch with one intra-op thread.  ``device`` and
``dtype`` place the tower (:mod:`schedulers.devices`): it is built in ``dtype`` as ``from_pretrained`` builds
it, the inputs go to its device, and the outputs come back on the CPU in float32 wherever it ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from omnitrio.contract import StagePayload
from schedulers.devices import Placement, to_host
from schedulers.qwen3_omni.checkpoint import load_config, load_weights, preflight, require_model_dir
from schedulers.qwen3_omni.front.warm_up import audio_warm_up, image_warm_up
from schedulers.qwen3_omni.handoffs import AudioEmbeddings, AudioEncoderInput, ImageEmbeddings, ImageEncoderInput
from schedulers.simple import SimpleScheduler
from schedulers.warm_up import WarmUp

Batch = list[StagePayload]
T = TypeVar("T")


def _inputs(payloads: Batch, kind: type[T], stage: str) -> list[T]:
    for payload in payloads:
        if not isinstance(payload.data, kind):
            raise ValueError(f"{stage}: expected a {kind.__name__}, got {type(payload.data).__name__}")
    return [payload.data for payload in payloads]


class AudioTower:
    """The thinker's audio tower alone: :meth:`encode` maps requests' features to their embeddings."""

    def __init__(self, model_dir: str, placement: Placement = Placement()) -> None:
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeAudioEncoder

        config = load_config(model_dir).thinker_config.audio_config
        self.placement = placement
        self.tower = placement.build(Qwen3OmniMoeAudioEncoder, config)
        load_weights(model_dir, "thinker.audio_tower.", self.tower)
        placement.move(self.tower)

    def encode(self, requests: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per ``(input_features, feature_attention_mask)``: ``(embeds [tokens, H], lengths [n_clips])``."""
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

        packed, lengths = [], []
        for features, mask in requests:
            if features.ndim != 3 or mask.shape != (features.shape[0], features.shape[2]):
                raise ValueError(
                    f"audio_encoder: input_features {list(features.shape)} and feature_attention_mask "
                    f"{list(mask.shape)} do not match ([clips, mels, T] and [clips, T])"
                )
            packed.append(features.permute(0, 2, 1)[mask.bool()].permute(1, 0))
            lengths.append(mask.sum(-1).long())
        all_lengths = torch.cat(lengths)
        with torch.inference_mode():
            features = self.placement.put(torch.cat(packed, dim=1))
            out = self.tower(features, feature_lens=self.placement.put(all_lengths)).last_hidden_state
        out = to_host(out)
        tokens = [int(_get_feat_extract_output_lengths(n, self.tower.n_window).sum()) for n in lengths]
        return list(zip(torch.split(out, tokens), lengths, strict=True))


class VisionTower:
    """The thinker's vision tower alone: :meth:`encode` maps requests' pixels to embeddings + deepstack."""

    def __init__(self, model_dir: str, placement: Placement = Placement()) -> None:
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeVisionEncoder

        config = load_config(model_dir).thinker_config.vision_config
        self.placement = placement
        self.tower = placement.build(Qwen3OmniMoeVisionEncoder, config)
        load_weights(model_dir, "thinker.visual.", self.tower)
        placement.move(self.tower)
        self.merge = config.spatial_merge_size**2

    def encode(
        self, requests: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
        """Per ``(pixel_values, image_grid_thw)``: ``(embeds [tokens, H], deepstack [[tokens, H], ...])``."""
        pixels = torch.cat([p for p, _ in requests])
        grids = torch.cat([g for _, g in requests])
        if pixels.shape[0] != int(grids.prod(-1).sum()):
            raise ValueError(f"image_encoder: {pixels.shape[0]} patches for grids {grids.tolist()}")
        with torch.inference_mode():
            out = self.tower(self.placement.put(pixels), grid_thw=self.placement.put(grids))
        tokens = [int(g.prod(-1).sum()) // self.merge for _, g in requests]
        embeds = torch.split(to_host(out.pooler_output), tokens)
        deepstack = [torch.split(to_host(feature), tokens) for feature in out.deepstack_features]
        return [(embeds[i], [layer[i] for layer in deepstack]) for i in range(len(requests))]


def _batched(
    encode_batch: Callable[[Batch], Batch], max_batch_size: int, max_batch_wait_ms: float, warm_up: WarmUp
) -> SimpleScheduler:
    return SimpleScheduler(
        lambda payload: encode_batch([payload])[0],
        batch_compute_fn=encode_batch,
        max_batch_size=max_batch_size,
        max_batch_wait_ms=max_batch_wait_ms,
        batch_wait_when_idle=False,
        warm_up=warm_up,
    )


def audio_batch_fn(tower: AudioTower) -> Callable[[Batch], Batch]:
    """The stage's batch compute: payloads in, the same payloads out with the audio outputs as data."""

    def encode_batch(payloads: Batch) -> Batch:
        inputs = _inputs(payloads, AudioEncoderInput, "audio_encoder")
        outputs = tower.encode([(i.input_features, i.feature_attention_mask) for i in inputs])
        for payload, given, (embeds, lengths) in zip(payloads, inputs, outputs, strict=True):
            payload.data = AudioEmbeddings(embeds, lengths, given.encoders)
        return payloads

    return encode_batch


def image_batch_fn(tower: VisionTower) -> Callable[[Batch], Batch]:
    """The stage's batch compute: payloads in, the same payloads out with the image outputs as data."""

    def encode_batch(payloads: Batch) -> Batch:
        inputs = _inputs(payloads, ImageEncoderInput, "image_encoder")
        outputs = tower.encode([(i.pixel_values, i.image_grid_thw) for i in inputs])
        for payload, given, (embeds, deepstack) in zip(payloads, inputs, outputs, strict=True):
            payload.data = ImageEmbeddings(embeds, tuple(deepstack), given.image_grid_thw, given.encoders)
        return payloads

    return encode_batch


def create_audio_encoder_stage(
    *,
    model_dir: str | None = None,
    max_batch_size: int = 8,
    max_batch_wait_ms: float = 0,
    device: str = "cpu",
    dtype: str = "float32",
) -> SimpleScheduler:
    """The audio encoder stage (module docstring)."""
    placement = Placement.of("audio_encoder", device, dtype)
    torch.set_num_threads(1)
    tower = AudioTower(require_model_dir(model_dir), placement)
    warm_up = audio_warm_up(tower.encode, tower.tower.config.num_mel_bins)
    return _batched(audio_batch_fn(tower), max_batch_size, max_batch_wait_ms, warm_up)


def create_image_encoder_stage(
    *,
    model_dir: str | None = None,
    max_batch_size: int = 8,
    max_batch_wait_ms: float = 0,
    device: str = "cpu",
    dtype: str = "float32",
) -> SimpleScheduler:
    """The image encoder stage (module docstring)."""
    placement = Placement.of("image_encoder", device, dtype)
    torch.set_num_threads(1)
    tower = VisionTower(require_model_dir(model_dir), placement)
    warm_up = image_warm_up(tower.encode, tower.tower.config)
    return _batched(image_batch_fn(tower), max_batch_size, max_batch_wait_ms, warm_up)


create_audio_encoder_stage.preflight = preflight  # type: ignore[attr-defined]
create_image_encoder_stage.preflight = preflight  # type: ignore[attr-defined]
