"""Qwen3-Omni's text decode stage: the kit's :mod:`schedulers.engine.text_decode` over its handoffs.

What it sends, as content or transcript, is the kit module's promise; this module only names Qwen3-Omni's
:class:`~schedulers.engine.handoffs.DecodeToken` and
:class:`~schedulers.engine.handoffs.ThinkerResult` as its inputs.
"""

from __future__ import annotations

from pathlib import Path

from schedulers.checkpoints import checked_by
from schedulers.engine.handoffs import DecodeToken, ThinkerResult
from schedulers.engine.text_decode import TextDecodeScheduler, load_text_decode
from schedulers.qwen3_omni.checkpoint import preflight, require_model_dir


@checked_by(preflight)
def create_decode_stage(*, model_dir: str | Path | None = None) -> TextDecodeScheduler:
    """Stage factory: the checkpoint's tokenizer (``model_dir``), special tokens skipped."""
    return load_text_decode(require_model_dir(model_dir), token_type=DecodeToken, result_type=ThinkerResult)


__all__ = ["TextDecodeScheduler", "create_decode_stage"]
