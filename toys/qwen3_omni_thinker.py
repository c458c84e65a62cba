"""The thinker stage's inputs as the encoder stages would send them, and the stage itself, for tests and bench.

:func:`thinker_payload` turns a processor's output into the thinker's ``new_request`` data, computing the
audio and image embeddings with the reference model's own ``get_audio_features`` /
``get_image_features`` (what the encoder stages compute).  :func:`thinker_scheduler` builds the stage
from a checkpoint directory with its factory.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from schedulers.front.handoffs import ThinkerInput
from schedulers.qwen3_omni.handoffs import Knobs
from schedulers.qwen3_omni.thinker.stage import ThinkerScheduler, create_thinker_stage


def thinker_payload(reference: Any, inputs: Any, **knobs: Any) -> ThinkerInput:
    """The thinker's input for the processor output ``inputs`` (``knobs``: the fields of ``Knobs``)."""
    thinker = reference.thinker
    media: dict[str, Any] = {}
    with torch.inference_mode():
        if "input_features" in inputs:
            mask = inputs["feature_attention_mask"]
            audio = thinker.get_audio_features(inputs["input_features"], mask)
            media["audio_embeds"] = audio.last_hidden_state.clone()
            media["audio_feature_lengths"] = mask.sum(-1)
        if "pixel_values" in inputs:
            image = thinker.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
            media["image_embeds"] = torch.cat(image.pooler_output).clone()
            media["deepstack_image_embeds"] = tuple(torch.cat(d).clone() for d in image.deepstack_features)
            media["image_grid_thw"] = inputs["image_grid_thw"]
    return ThinkerInput(inputs["input_ids"][0], Knobs(**knobs), **media)


def thinker_scheduler(
    model_dir: Path,
    *,
    max_new_tokens: int = 64,
    eos_token_id: int | None = None,
    seed: int | None = None,
    on_step: Callable[[int], None] | None = None,
) -> ThinkerScheduler:
    """The thinker stage of the checkpoint in ``model_dir``, from its factory; ``on_step(n)`` runs after step n."""
    scheduler = create_thinker_stage(
        model_dir=str(model_dir), max_new_tokens=max_new_tokens, eos_token_id=eos_token_id, seed=seed
    )
    scheduler.on_step = on_step
    return scheduler
