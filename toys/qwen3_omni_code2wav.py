"""Random ``Qwen3OmniMoeCode2Wav`` models in memory, for the code2wav tests and benchmark.

At the library's initialisation some paths of the decoder barely exist (ConvNeXt blocks scaled by 1e-6,
transformer layers by 0.01, snake activations all alike), so a stream that ignored them would still look
right.  :func:`enliven` draws those vectors too, so every path reaches the waveform and a wrong context
shows.  Sizes: ``tiny`` (hidden 32, 4 code groups, codebook 32, as in the tiny checkpoints), ``medium``
(hidden 256, decoder 256: compute dominates on CPU), ``release`` (the class defaults: the released
model's shape, ~200 M parameters).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

Size = Literal["tiny", "medium", "release"]

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "codebook_size": 32,
        "num_quantizers": 4,
        "hidden_size": 32,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "decoder_dim": 64,
        "initializer_range": 0.08,
    },
    "medium": {
        "codebook_size": 256,
        "num_quantizers": 8,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "decoder_dim": 256,
        "initializer_range": 0.035,
    },
    "release": {"num_quantizers": 16, "codebook_size": 2048, "initializer_range": 0.02},
}


def enliven(model: Qwen3OmniMoeCode2Wav, *, seed: int = 0) -> Qwen3OmniMoeCode2Wav:
    """Draw the per-channel scales and activation parameters the library initialises to (near) constants."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("gamma"):  # ConvNeXt blocks
                param.copy_(0.5 + torch.rand(param.shape, generator=generator))
            elif name.endswith("layer_scale.scale"):  # transformer residual branches
                param.copy_(0.2 + 0.6 * torch.rand(param.shape, generator=generator))
            elif name.endswith(("alpha", "beta")):  # snake activations (log scale)
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    return model


def build_code2wav(size: Size = "tiny", *, seed: int = 0) -> Qwen3OmniMoeCode2Wav:
    """A seeded, audible ``Qwen3OmniMoeCode2Wav`` of ``size``, in eval mode."""
    torch.manual_seed(seed)
    model = Qwen3OmniMoeCode2Wav(Qwen3OmniMoeCode2WavConfig(**SIZES[size]))
    return enliven(model, seed=seed).eval()


def random_codes(model: Qwen3OmniMoeCode2Wav, num_frames: int, *, seed: int = 0) -> torch.Tensor:
    """``Long[Q, num_frames]`` codes for ``model``."""
    generator = torch.Generator().manual_seed(seed)
    config = model.config
    return torch.randint(0, config.codebook_size, (config.num_quantizers, num_frames), generator=generator)


__all__ = ["SIZES", "build_code2wav", "enliven", "random_codes"]
