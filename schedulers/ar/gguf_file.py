"""A llama-architecture GGUF file read into the engine's terms: config, weights, tokenizer metadata.

:func:`read_gguf` opens the file with the ``gguf`` package and returns a :class:`GGUFModel`:

* ``config``: a :class:`~schedulers.ar.model.ModelConfig` from the ``llama.*`` metadata;
* :meth:`GGUFModel.tensor`: one weight under the engine's name (``layers.3.attn.wqkv.weight``: the
  file's Q, K and V stacked), dequantized to float32 (F32, F16, Q4_1 and Q8_0; anything else raises);
* :meth:`GGUFModel.q4_1_blocks`: a Q4_1 weight's raw codes, scales and minimums, so a fast format
  can hold the file's exact values (see :mod:`schedulers.ar.weight_formats`).

llama.cpp stores the Q and K projections with their rows permuted for its interleaved RoPE; every
weight returned here has that permutation undone, so the engine's half-split RoPE applies as in
the original checkpoint.  Every error is a :class:`GGUFError` naming the file and what is wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import attrs
import numpy as np
import torch

from schedulers.ar.model import ModelConfig


class GGUFError(ValueError):
    """A GGUF file that cannot be served: names the file and the problem."""


_LAYER_TENSORS: Final = {
    "attn_norm.weight": "attn_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "attn_output.weight": "attn.wo.weight",
    "ffn_down.weight": "ffn.w_down.weight",
}
_FUSED: Final = {
    "attn.wqkv.weight": ("attn_q.weight", "attn_k.weight", "attn_v.weight"),
    "ffn.w_gate_up.weight": ("ffn_gate.weight", "ffn_up.weight"),
}


def _reader_class() -> Any:
    import gguf

    class PlainReader(gguf.GGUFReader):  # type: ignore[misc]
        """``GGUFReader`` slicing a plain array view of its memmap: the metadata of a 49k-token vocabulary
        parses several times faster (a memmap slice costs a Python-level ``__array_finalize__``)."""

        def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> Any:
            plain = self.__dict__.get("_plain")
            if plain is None:
                plain = self._plain = self.data.view(np.ndarray)
            count = int(count)
            arr = plain[offset : offset + np.dtype(dtype).itemsize * count].view(dtype)[:count]
            return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    return PlainReader


@attrs.define(eq=False)
class GGUFModel:
    """An open GGUF file (memory-mapped); see the module docstring for what it offers."""

    path: Path
    config: ModelConfig
    metadata: dict[str, Any]
    _tensors: dict[str, Any]

    def fail(self, problem: str) -> GGUFError:
        return GGUFError(f"{self.path}: {problem}")

    def field(self, key: str, default: Any = ...) -> Any:
        """A metadata value (``tokenizer.ggml.tokens`` is a list of str); raises naming a missing key."""
        if key in self.metadata:
            return self.metadata[key]
        if default is ...:
            raise self.fail(f"metadata key {key!r} is missing")
        return default

    def tensor(self, name: str) -> torch.Tensor:
        """The float32 weight under its engine name (Q/K rows in the original order)."""
        return torch.cat([self._dequantized(part) for part in self._parts(name)])

    def q4_1_blocks(self, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``(codes uint8 [N, K], scale float32 [N, K/32], min float32 [N, K/32])`` with
        ``weight = codes * scale + min`` per group of 32, or None if any part is not Q4_1."""
        import gguf

        parts = []
        for gguf_name in self._parts(name):
            tensor = self._raw(gguf_name)
            if tensor.tensor_type != gguf.GGMLQuantizationType.Q4_1:
                return None
            parts.append([self._unpermute(gguf_name, a) for a in _q4_1(tensor)])
        codes, scale, low = (torch.cat([p[i] for p in parts]) for i in range(3))
        return codes, scale, low

    def _parts(self, name: str) -> list[str]:
        fused = _FUSED.get(name.split(".", 2)[-1]) if name.startswith("layers.") else None
        if fused is None:
            return [_gguf_name(name)]
        return [f"blk.{name.split('.')[1]}.{part}" for part in fused]

    def _raw(self, gguf_name: str) -> Any:
        tensor = self._tensors.get(gguf_name)
        if tensor is None:
            raise self.fail(f"tensor {gguf_name!r} is missing")
        return tensor

    def _dequantized(self, gguf_name: str) -> torch.Tensor:
        import gguf

        tensor = self._raw(gguf_name)
        q = gguf.GGMLQuantizationType
        shape = tuple(int(d) for d in reversed(tensor.shape))
        try:
            match tensor.tensor_type:
                case q.F32 | q.F16:
                    weight = torch.from_numpy(np.array(tensor.data, dtype=np.float32)).reshape(shape)
                case q.Q4_1:
                    codes, scale, low = _q4_1(tensor)
                    groups = codes.reshape(*scale.shape, 32).float()
                    weight = (groups * scale.unsqueeze(-1) + low.unsqueeze(-1)).reshape(shape)
                case q.Q8_0:
                    blocks = np.asarray(tensor.data).reshape(shape[0], -1, 34)
                    scale = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)).float()
                    values = torch.from_numpy(blocks[..., 2:].copy().view(np.int8)).float()
                    weight = (values * scale).reshape(shape)
                case other:
                    raise self.fail(f"tensor {gguf_name!r} has type {other.name}; supported: F32, F16, Q4_1, Q8_0")
        except (ValueError, RuntimeError) as exc:
            if isinstance(exc, GGUFError):
                raise
            raise self.fail(f"tensor {gguf_name!r} ({tensor.tensor_type.name}) cannot be read: {exc}") from exc
        return self._unpermute(gguf_name, weight)

    def _unpermute(self, gguf_name: str, rows: torch.Tensor) -> torch.Tensor:
        """Undo llama.cpp's Q/K row order (it interleaves each head's two RoPE halves); other rows as they are."""
        if not gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
            return rows
        heads = self.config.n_heads if gguf_name.endswith("attn_q.weight") else self.config.n_kv_heads
        half = rows.shape[0] // heads // 2
        return rows.reshape(heads, half, 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape).contiguous()


def _q4_1(tensor: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_1 tensor's codes ``[N, K]`` (uint8) and per-32 scale and min ``[N, K/32]`` (float32).

    A block is 20 bytes: scale (f16), min (f16), then 16 bytes whose low nibbles are elements 0-15
    and high nibbles elements 16-31."""
    blocks = np.asarray(tensor.data).reshape(int(tensor.shape[1]), -1, 20)
    scale = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16)[..., 0]).float()
    low = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16)[..., 0]).float()
    qs = torch.from_numpy(blocks[..., 4:].copy())
    codes = torch.empty(*qs.shape[:-1], 32, dtype=torch.uint8)
    torch.bitwise_and(qs, 0x0F, out=codes[..., :16])
    torch.bitwise_right_shift(qs, 4, out=codes[..., 16:])
    return codes.reshape(blocks.shape[0], -1), scale, low


def _gguf_name(name: str) -> str:
    match name.split("."):
        case ["embed", "weight"] | ["lm_head", "weight"]:
            return "token_embd.weight" if name.startswith("embed") else "output.weight"
        case ["norm", "weight"]:
            return "output_norm.weight"
        case ["layers", index, *rest] if ".".join(rest) in _LAYER_NAMES:
            return f"blk.{index}.{_LAYER_NAMES['.'.join(rest)]}"
    raise KeyError(f"no GGUF tensor maps to {name!r}")


_LAYER_NAMES: Final = {engine: gguf for gguf, engine in _LAYER_TENSORS.items()}


def _metadata(reader: Any) -> dict[str, Any]:
    values = {}
    for key, field in reader.fields.items():
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            values[key] = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        else:
            values[key] = field.contents()
    return values


def read_gguf(path: str | Path, *, max_seq_len: int = 2048) -> GGUFModel:
    """Open a llama-architecture GGUF file; ``max_seq_len`` caps the context the engine allocates for."""
    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"{path}: no such file")
    try:
        reader = _reader_class()(str(path))
    except Exception as exc:
        raise GGUFError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
    metadata = _metadata(reader)
    arch = metadata.get("general.architecture")
    if arch != "llama":
        raise GGUFError(f"{path}: general.architecture is {arch!r}; only 'llama' is supported")
    tensors = {t.name: t for t in reader.tensors}
    model = GGUFModel(path, ModelConfig(), metadata, tensors)

    def number(key: str) -> Any:
        return model.field(f"llama.{key}")

    n_heads = int(number("attention.head_count"))
    dim = int(number("embedding_length"))
    vocab = metadata.get("llama.vocab_size", len(model.field("tokenizer.ggml.tokens")))
    rope_dims = int(metadata.get("llama.rope.dimension_count", dim // n_heads))
    if rope_dims != dim // n_heads:
        raise model.fail(f"llama.rope.dimension_count={rope_dims}: partial RoPE is not supported")
    try:
        model.config = ModelConfig(
            vocab_size=int(vocab),
            dim=dim,
            n_layers=int(number("block_count")),
            n_heads=n_heads,
            n_kv_heads=int(metadata.get("llama.attention.head_count_kv", n_heads)),
            ffn_dim=int(number("feed_forward_length")),
            max_seq_len=min(max_seq_len, int(number("context_length"))),
            rope_theta=float(metadata.get("llama.rope.freq_base", 10000.0)),
            norm_eps=float(number("attention.layer_norm_rms_epsilon")),
            tie_embeddings="output.weight" not in tensors,
        )
    except ValueError as exc:
        raise model.fail(f"unusable shape in the llama.* metadata: {exc}") from exc
    return model
