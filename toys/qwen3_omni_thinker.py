"""The thinker stage's inputs as the encoder stages would send them, and the stage itself, for tests and bench.

:func:`thinker_payload` turns a processor's output into the thinker's ``new_request`` data, computing the
audio and image embeddings with the reference model's own ``get_audio_features`` /
``get_image_features`` (what the encoder stages compute).  :func:`thinker_scheduler` builds the stage
from a checkpoint directory as its factory does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from schedulers.qwen3_omni.thinker import ThinkerScheduler
from schedulers.qwen3_omni.thinker_engine import ThinkerEngine
from schedulers.qwen3_omni.thinker_model import ThinkerLM, state_dict_loader


def thinker_payload(reference: Any, inputs: Any, **knobs: Any) -> dict[str, Any]:
    """The thinker's input for the processor output ``inputs`` (``knobs``: max_new_tokens, temperature, ...)."""
    thinker = reference.thinker
    data: dict[str, Any] = {"input_ids": inputs["input_ids"][0], "want_audio": False}
    with torch.inference_mode():
        if "input_features" in inputs:
            mask = inputs["feature_attention_mask"]
            audio = thinker.get_audio_features(inputs["input_features"], mask)
            data["audio_embeds"] = audio.last_hidden_state.clone()
            data["audio_feature_lengths"] = mask.sum(-1)
        if "pixel_values" in inputs:
            image = thinker.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
            data["image_embeds"] = torch.cat(image.pooler_output).clone()
            data["deepstack_image_embeds"] = [torch.cat(d).clone() for d in image.deepstack_features]
            data["image_grid_thw"] = inputs["image_grid_thw"]
    data.update(knobs)
    return data


def thinker_lm(model_dir: str | Path) -> ThinkerLM:
    """The thinker language model of the checkpoint in ``model_dir`` (loaded once per directory)."""
    return _thinker_lm(str(model_dir))


@functools.cache
def _thinker_lm(model_dir: str) -> ThinkerLM:
    from toys.qwen3_omni_reference import load_reference_model

    model = load_reference_model(Path(model_dir))
    state = {f"thinker.model.{k}": v for k, v in model.thinker.model.language_model.state_dict().items()}
    state.update({f"thinker.lm_head.{k}": v for k, v in model.thinker.lm_head.state_dict().items()})
    return ThinkerLM.build(model.config, state_dict_loader(state))


def thinker_scheduler(
    model_dir: Path,
    *,
    max_new_tokens: int = 64,
    eos_token_id: int | None = None,
    seed: int | None = None,
    on_step: Callable[[int], None] | None = None,
) -> ThinkerScheduler:
    """The thinker stage of the checkpoint in ``model_dir``; ``on_step(n)`` runs after each step n."""
    lm = _thinker_lm(str(model_dir))
    eos = eos_token_id if eos_token_id is not None else int(lm.config.im_end_token_id)
    engine = ThinkerEngine(lm)
    return ThinkerScheduler(engine, eos_token_id=eos, max_new_tokens=max_new_tokens, seed=seed, on_step=on_step)
