"""The front's stages every omni family builds the same way: preprocess, batched encoders, aggregate.

* :func:`create_preprocess_stage`: one function from the client's chat inputs to the family's
  preprocess handoff; a ``ValueError`` it raises is the client's mistake (a 400 naming the field,
  :func:`schedulers.front.chat.client_error`), anything else a stage failure.  :func:`preprocessed_fields`
  gives that handoff's fields from the processor's tensors.
* :func:`encoder_stage_factory`: a family's encoder stage factory (what its config names) from its tower
  and batch compute; :func:`create_encoder_stage`: a tower over a batch of requests.  A batch forms only from requests
  already waiting (``batch_wait_when_idle=False``): a lone request never waits for company.  Requests
  batch *packed*, not padded, as the towers batch clips and images themselves: every clip (image) of
  every request goes into one call along the sequence axis with its own length (grid), and the output
  is split back by token counts.  :func:`pack_clips` packs audio features; :func:`handoffs` checks a
  batch's inputs; :func:`audio_batch_fn` is the audio stage's batch compute over any family's tower.
* :func:`create_aggregate_stage`: the fan-in point where the thinker's input is whole: the runtime
  gathers ``preprocess`` and the encoders a request needs and the family's ``merge_fn`` builds the
  thinker's input from them, so the stage passes it on unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import torch

from omnitrio.contract import StagePayload
from schedulers.checkpoints import require_model_dir
from schedulers.devices import Placement
from schedulers.front.chat import client_error
from schedulers.front.handoffs import AudioEmbeddings, AudioEncoderInput
from schedulers.front.warm_up import audio_warm_up, image_warm_up
from schedulers.graph.front import AUDIO_ENCODER, IMAGE_ENCODER
from schedulers.simple import SimpleScheduler
from schedulers.warm_up import WarmUp

Batch = list[StagePayload]
T = TypeVar("T")


def create_preprocess_stage(
    preprocess: Callable[[Any], Any], *, max_concurrency: int = 1, warm_up: WarmUp | None = None
) -> SimpleScheduler:
    """``payload.data`` (the chat inputs, or ``{"raw_inputs": inputs}``) → ``preprocess(inputs)``; the
    stage runs ``warm_up`` before it reports ready."""

    def compute(payload: StagePayload) -> StagePayload:
        data = payload.data
        raw = data["raw_inputs"] if isinstance(data, dict) and "raw_inputs" in data else data
        try:
            payload.data = preprocess(raw)
        except ValueError as exc:
            raise client_error(exc) from None
        return payload

    return SimpleScheduler(compute, max_concurrency=max_concurrency, warm_up=warm_up)


MEDIA_FIELDS = ("input_features", "feature_attention_mask", "pixel_values", "image_grid_thw")


def preprocessed_fields(tensors: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """A processor's tensors for one prompt (:meth:`schedulers.front.processor.ChatProcessor.__call__`) as
    the fields of a family's preprocess handoff: ``input_ids`` ``Long[P]``, ``encoders`` (the encoder stages
    its media need, in graph order) and the media's tensors (None where the prompt has none)."""
    audio, images = "input_features" in tensors, "pixel_values" in tensors
    return {
        "input_ids": tensors["input_ids"][0],
        "encoders": (AUDIO_ENCODER,) * audio + (IMAGE_ENCODER,) * images,
        **{name: tensors.get(name) for name in MEDIA_FIELDS},
    }


def handoffs(payloads: Batch, kind: type[T], stage: str) -> list[T]:
    """The batch's handoffs, each a ``kind``; a ``ValueError`` naming ``stage`` otherwise."""
    for payload in payloads:
        if not isinstance(payload.data, kind):
            raise ValueError(f"{stage}: expected a {kind.__name__}, got {type(payload.data).__name__}")
    return [payload.data for payload in payloads]


def pack_clips(requests: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Per request ``(input_features [clips, mels, T], feature_attention_mask [clips, T])`` → every clip's
    valid frames side by side ``[mels, frames]`` and, per request, its clips' frame counts ``Long[clips]``."""
    packed, lengths = [], []
    for features, mask in requests:
        if features.ndim != 3 or mask.shape != (features.shape[0], features.shape[2]):
            raise ValueError(
                f"audio_encoder: input_features {list(features.shape)} and feature_attention_mask "
                f"{list(mask.shape)} do not match ([clips, mels, T] and [clips, T])"
            )
        packed.append(features.permute(0, 2, 1)[mask.bool()].permute(1, 0))
        lengths.append(mask.sum(-1).long())
    return torch.cat(packed, dim=1), lengths


class AudioEncoder(Protocol):
    def encode(self, requests: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per request ``(input_features, feature_attention_mask)`` → ``(embeds [tokens, H], lengths [clips])``."""
        ...


def audio_batch_fn(tower: AudioEncoder) -> Callable[[Batch], Batch]:
    """The audio stage's batch compute: payloads holding :class:`AudioEncoderInput` in, the same payloads
    out holding their :class:`AudioEmbeddings`."""

    def encode_batch(payloads: Batch) -> Batch:
        inputs = handoffs(payloads, AudioEncoderInput, "audio_encoder")
        outputs = tower.encode([(i.input_features, i.feature_attention_mask) for i in inputs])
        for payload, given, (embeds, lengths) in zip(payloads, inputs, outputs, strict=True):
            payload.data = AudioEmbeddings(embeds, lengths, given.encoders)
        return payloads

    return encode_batch


def create_encoder_stage(
    encode_batch: Callable[[Batch], Batch],
    *,
    max_batch_size: int = 8,
    max_batch_wait_ms: float = 0,
    warm_up: WarmUp | None = None,
) -> SimpleScheduler:
    """An encoder stage over ``encode_batch`` (payloads in, the same payloads out with new data) that runs
    ``warm_up`` before it reports ready."""
    return SimpleScheduler(
        lambda payload: encode_batch([payload])[0],
        batch_compute_fn=encode_batch,
        max_batch_size=max_batch_size,
        max_batch_wait_ms=max_batch_wait_ms,
        batch_wait_when_idle=False,
        warm_up=warm_up,
    )


def encoder_stage_factory(
    stage: str,
    tower: Callable[[str, Placement], T],
    batch_fn: Callable[[T], Callable[[Batch], Batch]],
    preflight: Callable[..., None],
    warm_up: Callable[[T], WarmUp] | None = None,
) -> Callable[..., SimpleScheduler]:
    """The factory of ``stage``: ``(*, model_dir, max_batch_size=8, max_batch_wait_ms=0, device="cpu",
    dtype="float32")`` builds ``tower(model_dir, placement)`` (``device`` and ``dtype`` checked by
    :meth:`schedulers.devices.Placement.of`), runs torch with one intra-op thread and serves
    ``batch_fn(tower)`` as :func:`create_encoder_stage`, warmed by ``warm_up(tower)`` before it reports
    ready; ``omnitrio check`` runs ``preflight`` on its arguments."""

    def create(
        *,
        model_dir: str | None = None,
        max_batch_size: int = 8,
        max_batch_wait_ms: float = 0,
        device: str = "cpu",
        dtype: str = "float32",
    ) -> SimpleScheduler:
        placement = Placement.of(stage, device, dtype)
        torch.set_num_threads(1)
        built = tower(require_model_dir(model_dir), placement)
        return create_encoder_stage(
            batch_fn(built),
            max_batch_size=max_batch_size,
            max_batch_wait_ms=max_batch_wait_ms,
            warm_up=None if warm_up is None else warm_up(built),
        )

    create.__name__ = create.__qualname__ = f"create_{stage}_stage"
    create.__doc__ = f"The {stage} stage: {tower.__qualname__} batched across requests ({__name__})."
    create.preflight = preflight  # type: ignore[attr-defined]
    return create


def encoder_stage_factories(
    audio_tower: Callable[[str, Placement], Any],
    vision_tower: Callable[[str, Placement], Any],
    image_batch_fn: Callable[[Any], Callable[[Batch], Batch]],
    preflight: Callable[..., None],
) -> tuple[Callable[..., SimpleScheduler], Callable[..., SimpleScheduler]]:
    """A family's ``audio_encoder`` and ``image_encoder`` stage factories (:func:`encoder_stage_factory`):
    the audio one over :func:`audio_batch_fn`, the image one over ``image_batch_fn``, each warmed by
    :mod:`schedulers.front.warm_up` at the sizes of its transformers module (the tower's ``tower``)."""
    audio = encoder_stage_factory(
        AUDIO_ENCODER,
        audio_tower,
        audio_batch_fn,
        preflight,
        lambda tower: audio_warm_up(tower.encode, tower.tower.config.num_mel_bins),
    )
    image = encoder_stage_factory(
        IMAGE_ENCODER,
        vision_tower,
        image_batch_fn,
        preflight,
        lambda tower: image_warm_up(tower.encode, tower.tower.config),
    )
    return audio, image


def create_aggregate_stage() -> SimpleScheduler:
    """The fan-in point (module docstring): passes on what the family's ``merge_fn`` built."""
    return SimpleScheduler(lambda payload: payload)


__all__ = [
    "AudioEncoder",
    "audio_batch_fn",
    "create_aggregate_stage",
    "create_encoder_stage",
    "create_preprocess_stage",
    "encoder_stage_factories",
    "encoder_stage_factory",
    "handoffs",
    "pack_clips",
    "preprocessed_fields",
]
