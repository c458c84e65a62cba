"""A tiny Llama-style decoder (RMSNorm, RoPE, GQA attention, SwiGLU) with a per-slot KV cache.

The weights are random, drawn from ``ModelConfig.seed``: two models built from equal configs are
identical, so a test can build its oracle from the same config without sharing objects.

The cache is one preallocated tensor ``[slots, layers, 2, kv_heads, max_seq_len, head_dim]``.  A slot
is a request's row; :meth:`TinyLlama.forward` writes the new keys/values of each row at that row's own
start position and masks attention per row, so requests of different lengths decode in one batch.
Positions at or beyond a slot's length may hold stale values from an earlier request or from padding:
they are never read, because a row only attends to positions ``<=`` its own query position and every
position is written before it is read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import attrs
import torch
import torch.nn.functional as F
from torch import nn


@attrs.frozen
class ModelConfig:
    """Shape of the tiny model; ``seed`` fixes its random weights."""

    vocab_size: int = 2048
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 2
    ffn_dim: int = 704
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    seed: int = 0
    tie_embeddings: bool = False

    def __attrs_post_init__(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(f"ModelConfig: dim={self.dim} is not a multiple of n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"ModelConfig: n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if (self.dim // self.n_heads) % 2:
            raise ValueError(f"ModelConfig: head_dim={self.dim // self.n_heads} must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class KVCache:
    """Preallocated keys/values for ``slots`` sequences; the engine owns slot assignment and lengths."""

    def __init__(self, config: ModelConfig, slots: int, dtype: torch.dtype) -> None:
        shape = (slots, config.n_layers, 2, config.n_kv_heads, config.max_seq_len, config.head_dim)
        self.data = torch.zeros(shape, dtype=dtype)
        self.slots = slots
        self.max_seq_len = config.max_seq_len


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight


def rope_tables(config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``[max_seq_len, head_dim // 2]`` (float32)."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(half, dtype=torch.float64) / half))
    angles = torch.outer(torch.arange(config.max_seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, H, T, D]`` by per-row positions (``cos``/``sin`` are ``[B, 1, T, D/2]``)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.head_dim
        self.wqkv = nn.Linear(config.dim, (config.n_heads + 2 * config.n_kv_heads) * config.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q ``[B, H, T, D]``, k and v ``[B, KVH, T, D]``, RoPE applied to q and k."""
        b, t, _ = x.shape
        qkv = self.wqkv(x).view(b, t, self.n_heads + 2 * self.n_kv_heads, self.head_dim).transpose(1, 2)
        qk = apply_rope(qkv[:, : self.n_heads + self.n_kv_heads], cos, sin)
        return qk[:, : self.n_heads], qk[:, self.n_heads :], qkv[:, self.n_heads + self.n_kv_heads :]

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool = False
    ) -> torch.Tensor:
        """Attention output projected back to ``[B, T, dim]``."""
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=True)
        b, _, t, _ = out.shape
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.w_gate_up = nn.Linear(config.dim, 2 * config.ffn_dim, bias=False)
        self.w_down = nn.Linear(config.ffn_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w_gate_up(x).chunk(2, dim=-1)
        return self.w_down(F.silu(gate) * up)


class Block(nn.Module):
    attn_norm: RMSNorm
    attn: Attention
    ffn_norm: RMSNorm
    ffn: FeedForward

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.dim, config.norm_eps)
        self.attn = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn = FeedForward(config)


class TinyLlama(nn.Module):
    """The decoder.  Use :meth:`forward` with a :class:`KVCache`; all calls must run under no-grad."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, config: ModelConfig, *, random_init: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.lm_head: nn.Module = nn.Linear(config.dim, config.vocab_size, bias=False)
        cos, sin = rope_tables(config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if random_init:
            self._init_weights()

    def _init_weights(self) -> None:
        generator = torch.Generator().manual_seed(self.config.seed)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                continue
            fan_in = param.shape[-1] if param.dim() > 1 and not name.startswith("embed") else 1
            std = 1.0 / math.sqrt(fan_in)
            with torch.no_grad():
                param.copy_(torch.randn(param.shape, generator=generator) * std)

    @property
    def blocks(self) -> list[Block]:
        return cast(list[Block], list(self.layers))

    def rope_at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[B, 1, T, D/2]`` for ``positions [B, T]``."""
        return self.rope_cos[positions].unsqueeze(1), self.rope_sin[positions].unsqueeze(1)

    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        slots: list[int],
        starts: list[int],
        logits_at: list[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``tokens [B, T]``; row ``b`` continues slot ``slots[b]`` at position ``starts[b]``.

        Returns ``(logits [B, T, vocab] float32, hidden [B, T, dim])`` where ``hidden`` is the final
        normed hidden state; with ``logits_at`` (one index into ``T`` per row) logits are
        ``[B, 1, vocab]``, of those positions only (a prefill needs only its last).  Keys/values of
        all ``T`` tokens are written into the cache (rows padded on the right write values past their
        end: harmless, see the module docstring).  The caller keeps the lengths; ``starts[b] + T``
        must not exceed ``max_seq_len``.
        """
        b, t = tokens.shape
        offsets = torch.arange(t)
        positions = torch.tensor(starts).unsqueeze(1) + offsets  # [B, T]
        kv_len = max(starts) + t
        if kv_len > cache.max_seq_len:
            raise ValueError(f"sequence length {kv_len} exceeds max_seq_len={cache.max_seq_len}")
        cos, sin = self.rope_at(positions)
        contiguous = slots == list(range(slots[0], slots[0] + b))
        slot_index = torch.tensor(slots)
        same_start = all(s == starts[0] for s in starts)
        mask: torch.Tensor | None = None
        if not (same_start and t == 1):
            # Row b, query at position p may see key j <= p.
            mask = (torch.arange(kv_len) <= positions.unsqueeze(-1)).unsqueeze(1)  # [B, 1, T, kv_len]
        x = self.embed(tokens)
        for layer_index, layer in enumerate(self.blocks):
            h = layer.attn_norm(x)
            q, k, v = layer.attn.project(h, cos, sin)
            layer_cache = cache.data[:, layer_index]  # [S, 2, KVH, L, D] view
            if same_start:
                start = starts[0]
                if contiguous:
                    layer_cache[slots[0] : slots[0] + b, 0, :, start : start + t] = k
                    layer_cache[slots[0] : slots[0] + b, 1, :, start : start + t] = v
                else:
                    layer_cache[slot_index, 0, :, start : start + t] = k
                    layer_cache[slot_index, 1, :, start : start + t] = v
            elif t == 1:
                pos_index = torch.tensor(starts)
                layer_cache[slot_index, 0, :, pos_index] = k[:, :, 0]
                layer_cache[slot_index, 1, :, pos_index] = v[:, :, 0]
            else:
                for row, (slot, start) in enumerate(zip(slots, starts, strict=True)):
                    layer_cache[slot, 0, :, start : start + t] = k[row]
                    layer_cache[slot, 1, :, start : start + t] = v[row]
            if contiguous:
                keys = layer_cache[slots[0] : slots[0] + b, 0, :, :kv_len]
                values = layer_cache[slots[0] : slots[0] + b, 1, :, :kv_len]
            else:
                keys = layer_cache[slot_index, 0, :, :kv_len]
                values = layer_cache[slot_index, 1, :, :kv_len]
            x = x + layer.attn.attend(q, keys, values, mask)
            x = x + layer.ffn(layer.ffn_norm(x))
        hidden = self.norm(x)
        if logits_at is not None:
            picked = hidden[torch.arange(b), torch.tensor(logits_at)].unsqueeze(1)
            return self.lm_head(picked).float(), hidden
        return self.lm_head(hidden).float(), hidden

    def forward_full(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T, vocab]`` of a whole sequence with causal attention and no cache (the oracle's path)."""
        t = tokens.shape[1]
        positions = torch.arange(t).expand(tokens.shape[0], t)
        cos, sin = self.rope_at(positions)
        x = self.embed(tokens)
        for layer in self.blocks:
            q, k, v = layer.attn.project(layer.attn_norm(x), cos, sin)
            x = x + layer.attn.attend(q, k, v, None, is_causal=True)
            x = x + layer.ffn(layer.ffn_norm(x))
        return self.lm_head(self.norm(x)).float()


def build_model(
    config: ModelConfig, dtype: torch.dtype = torch.float32, weights: Callable[[str], torch.Tensor] | None = None
) -> TinyLlama:
    """A model cast to ``dtype`` and in eval mode, with the config's seeded random weights, or with
    ``weights(name)`` for every parameter name (``embed.weight``, ``layers.0.attn.wqkv.weight``, ...);
    with ``config.tie_embeddings`` the output projection shares ``embed.weight``."""
    if weights is None:
        model = TinyLlama(config)
    else:
        with torch.device("meta"):
            model = TinyLlama(config, random_init=False)
        names = [
            name for name, _ in model.named_parameters() if not (config.tie_embeddings and name == "lm_head.weight")
        ]
        state = {name: weights(name) for name in names}
        if config.tie_embeddings:
            state["lm_head.weight"] = state["embed.weight"]
        model.load_state_dict(state, strict=True, assign=True)
        cos, sin = rope_tables(config)
        model.rope_cos, model.rope_sin = cos, sin
    model = model.to(dtype)
    model.rope_cos = model.rope_cos.float()
    model.rope_sin = model.rope_sin.float()
    return model.eval()
