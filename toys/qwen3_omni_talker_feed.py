"""transformers' own ``generate(return_audio=True)`` seen as the talker stage sees it (tests and bench).

:func:`reference_run` runs the whole model once and returns the thinker's stream as the thinker stage
sends it (a ``TalkerPrompt``, then one ``TalkerToken`` per generated token, built from ``generate``'s
own ``output_hidden_states``) together with the codes ``generate`` handed to code2wav, so a talker
fed those chunks can be compared code for code.  The thinker is greedy; so is the talker unless
``talker_do_sample`` (then ``generate``'s talker and code predictor draw from torch's global generator
with its talker defaults: seed it first).
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from schedulers.qwen3_omni.handoffs import TalkerPrompt, TalkerToken


@attrs.frozen
class Reference:
    chunks: list[TalkerPrompt | TalkerToken]
    codes: torch.Tensor
    """``[Q, N]``: the frames ``generate`` decoded (codec_eos frame excluded)."""
    token_ids: list[int]


def reference_run(
    model: Any,
    inputs: dict[str, Any],
    *,
    speaker: str,
    thinker_max_new_tokens: int = 12,
    talker_max_new_tokens: int = 40,
    talker_min_new_tokens: int = 2,
    eos_token_id: int | None = None,
    talker_do_sample: bool = False,
) -> Reference:
    """Run ``model.generate`` on processor ``inputs`` (``input_ids`` and whatever else), the thinker greedy."""
    captured: dict[str, Any] = {}
    thinker_generate = model.thinker.generate
    chunked_decode = model.code2wav.chunked_decode

    def capture_thinker(*args: Any, **kwargs: Any) -> Any:
        captured["thinker"] = result = thinker_generate(*args, **kwargs)
        return result

    def capture_codes(codes: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        captured["codes"] = codes[0].clone()
        return chunked_decode(codes, *args, **kwargs)

    model.thinker.generate = capture_thinker
    model.code2wav.chunked_decode = capture_codes
    try:
        with torch.no_grad():
            model.generate(
                **inputs,
                return_audio=True,
                speaker=speaker,
                thinker_do_sample=False,
                talker_do_sample=talker_do_sample,
                thinker_max_new_tokens=thinker_max_new_tokens,
                thinker_eos_token_id=eos_token_id if eos_token_id is not None else model.config.im_end_token_id,
                talker_max_new_tokens=talker_max_new_tokens,
                talker_min_new_tokens=talker_min_new_tokens,
            )
    finally:
        del model.thinker.generate, model.code2wav.chunked_decode
    result = captured["thinker"]
    prompt_len = inputs["input_ids"].shape[1]
    first = result.hidden_states[0]
    layer = model.config.talker_config.accept_hidden_layer
    prompt_ids = result.sequences[0, :prompt_len]
    generated = result.sequences[0, prompt_len:]
    embed = model.thinker.get_input_embeddings()
    mask = inputs.get("feature_attention_mask")
    chunks: list[TalkerPrompt | TalkerToken] = [
        TalkerPrompt(
            prompt_ids.clone(),
            first[0][0].clone(),
            first[layer][0].clone(),
            speaker=speaker,
            image_grid_thw=inputs.get("image_grid_thw"),
            audio_feature_lengths=None if mask is None else mask.sum(dim=1),
        )
    ]
    with torch.no_grad():
        for token in generated:
            chunks.append(TalkerToken(int(token), embed(token.view(1)).clone()))
    return Reference(chunks, captured["codes"], generated.tolist())
