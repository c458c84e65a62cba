"""Weight formats for a GGUF model's projections: what each decode step reads from memory.

Decoding one token reads every weight once, so batch-1 speed is bandwidth / bytes per token.
:func:`load_model` builds the engine's model from a GGUF file in one of:

* ``"float32"``: the dequantized weights as they are, float32 activations (the reference);
* ``"bfloat16"``: the same weights rounded to bfloat16, bfloat16 activations;
* ``"int8"``: int8 with one scale per output row (``torch._weight_int8pack_mm``), bfloat16 activations;
* ``"int4"``: the file's Q4_1 codes in torch's int4 CPU layout (``torch._weight_int4pack_mm_for_cpu``,
  groups of 32: ``(code - 8) * scale + zero`` with ``zero = min + 8 * scale``; scale and zero are
  rounded to bfloat16), bfloat16 activations; projections stored in another type, and the output
  projection, are int8 as above.

torch's int4 and int8 CPU kernels are fast only with bfloat16 (or half) activations: with float32
ones they take a slow path, so the quantized formats compute in bfloat16.
"""

from __future__ import annotations

from typing import Final, Literal

import torch
from torch import nn

from schedulers.ar.gguf_file import GGUFModel
from schedulers.ar.model import TinyLlama, build_model

WeightFormat = Literal["float32", "bfloat16", "int8", "int4"]
WEIGHT_FORMATS: Final = ("float32", "bfloat16", "int8", "int4")
_GROUP: Final = 32


class Int8Linear(nn.Module):
    """``x @ W.T`` with ``W`` stored as int8 rows and a scale per row (in the activations' dtype)."""

    qweight: torch.Tensor
    scale: torch.Tensor

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        weight = weight.float()
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        self.register_buffer("qweight", torch.round(weight / scale[:, None]).to(torch.int8))
        self.register_buffer("scale", scale.to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [rows, in]`` in the scale's dtype."""
        return torch._weight_int8pack_mm(x, self.qweight, self.scale)


class Int4Linear(nn.Module):
    """``x @ W.T`` with ``W = codes * scale + min`` per group of 32 inputs (the Q4_1 layout)."""

    packed: torch.Tensor
    scales_and_zeros: torch.Tensor

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("packed", torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 2))
        zero = low + 8 * scale
        self.register_buffer("scales_and_zeros", torch.stack([scale.t(), zero.t()], dim=-1).to(dtype).contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [rows, in]`` in the scales' dtype."""
        return torch._weight_int4pack_mm_for_cpu(x, self.packed, _GROUP, self.scales_and_zeros)


def load_model(source: GGUFModel, fmt: WeightFormat) -> TinyLlama:
    """The engine's model with ``source``'s weights in format ``fmt`` (see the module docstring)."""
    if fmt not in WEIGHT_FORMATS:
        raise ValueError(f"weight format {fmt!r} is not one of {list(WEIGHT_FORMATS)}")
    dtype = torch.float32 if fmt == "float32" else torch.bfloat16
    model = build_model(source.config, dtype, weights=source.tensor)
    if fmt in ("float32", "bfloat16"):
        return model
    for index, block in enumerate(model.blocks):
        for part, owner, attr in (
            ("attn", block.attn, "wqkv"),
            ("attn", block.attn, "wo"),
            ("ffn", block.ffn, "w_gate_up"),
            ("ffn", block.ffn, "w_down"),
        ):
            name = f"layers.{index}.{part}.{attr}.weight"
            blocks = source.q4_1_blocks(name) if fmt == "int4" else None
            packed = Int4Linear(*blocks, dtype) if blocks is not None else Int8Linear(source.tensor(name), dtype)
            setattr(owner, attr, packed)
    head = "embed.weight" if model.config.tie_embeddings else "lm_head.weight"
    model.lm_head = Int8Linear(source.tensor(head), dtype)
    return model
