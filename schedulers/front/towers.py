"""A thinker's encoder tower alone, on its placement: built, filled from its checkpoint part, run packed.

:func:`load_tower` builds a transformers tower class from its configuration in the placement's dtype (as
``from_pretrained`` builds it), loads only the checkpoint's tensors under its prefix and moves it to the
placement's device.  :func:`run_vision` runs a Qwen-style vision tower over every request's images in one
call (packed along the patch axis, each image's grid kept apart) and says how many tokens each request's
images make; the tower's output stays on its device for the caller to split.  :func:`thinker_widths` names
the widths a checkpoint's towers and thinker must agree on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from schedulers.devices import Placement


def thinker_widths(thinker_config: Any) -> tuple[tuple[str, int], ...]:
    """The widths that must all be the thinker's text width, as ``(field, value)`` for
    :func:`schedulers.checkpoints.check_equal`: its text model's and its audio and vision towers' outputs."""
    return (
        ("thinker_config.text_config.hidden_size", thinker_config.text_config.hidden_size),
        ("thinker_config.audio_config.output_dim", thinker_config.audio_config.output_dim),
        ("thinker_config.vision_config.out_hidden_size", thinker_config.vision_config.out_hidden_size),
    )


def load_tower(
    tower_class: Any,
    config: Any,
    placement: Placement,
    load_weights: Callable[[str | Path, str, torch.nn.Module], None],
    model_dir: str | Path,
    prefix: str,
) -> Any:
    """``tower_class`` built from ``config`` on ``placement``, holding the tensors under ``prefix``."""
    tower = placement.build(tower_class, config)
    load_weights(model_dir, prefix, tower)
    placement.move(tower)
    return tower


def run_vision(
    tower: Any, placement: Placement, merge: int, requests: Sequence[tuple[torch.Tensor, torch.Tensor]]
) -> tuple[Any, list[int]]:
    """``tower(pixels, grid_thw=...)`` over every request's ``(pixel_values, image_grid_thw)`` at once, under
    ``torch.inference_mode``, and the tokens each request's images make (``merge`` patches a token).  A
    ``ValueError`` when the patches do not fill the grids."""
    pixels = torch.cat([p for p, _ in requests])
    grids = torch.cat([g for _, g in requests])
    if pixels.shape[0] != int(grids.prod(-1).sum()):
        raise ValueError(f"image_encoder: {pixels.shape[0]} patches for grids {grids.tolist()}")
    with torch.inference_mode():
        out = tower(placement.put(pixels), grid_thw=placement.put(grids))
    return out, [int(g.prod(-1).sum()) // merge for _, g in requests]


__all__ = ["load_tower", "run_vision", "thinker_widths"]
