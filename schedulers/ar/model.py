"""A tiny Llama-style decoder (RMSNorm, RoPE, GQA attention, SwiGLU) over the engine layer's KV batch.

The weights are random, drawn from ``ModelConfig.seed``: two models built from equal configs are
identical, so a test can build its oracle from the same config without sharing objects.

The keys/values live in a :class:`~schedulers.engine.kv_batch.KVBatch` (float32: the model makes them
in float32 whatever the weights' format).  :meth:`TinyLlama.forward` runs one
:class:`~schedulers.engine.kv_batch.KVStep`: each row's new keys/values go at that row's own length
and attention is masked per row, so requests of different lengths decode in one batch.  Positions
beyond a row's length may hold values from padding (a prefill of rows of different lengths, padded
on the right) or from an earlier request: they are never attended to, because a row only attends to
positions ``<=`` its own query position and every position is written before it is read.

Decoding one token is a few small operations per layer around four matrix products, so the forward
keeps the operation count low: the residual stream stays float32 and two-dimensional (``[rows, dim]``,
so a product is one call; only the products' inputs are cast to the weights' dtype), RoPE is applied
in place (a roll and two fused multiplies), attention is one ``scaled_dot_product_attention`` over
grouped key/value heads, and a layer's keys and values are written into the KV batch in one copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import attrs
import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:  # the engine's batch imports transformers, which the GGUF reader never needs
    from schedulers.engine.kv_batch import KVStep


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


class RMSNorm(nn.Module):
    """Normalizes float32 input (the residual stream is float32 whatever the weights' format)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def rope_tables(config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``[max_seq_len, head_dim]`` float32 tables: cos over both halves, and sin negated on the first half,
    so RoPE is ``x * cos + swap_halves(x) * sin`` (``swap_halves`` is a roll by half the head)."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(half, dtype=torch.float64) / half))
    angles = torch.outer(torch.arange(config.max_seq_len, dtype=torch.float64), inv_freq)
    cos, sin = angles.cos().float(), angles.sin().float()
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.head_dim
        self.wqkv = nn.Linear(config.dim, (config.n_heads + 2 * config.n_kv_heads) * config.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q [B, T, H, D], kv [B, T, 2 * KVH, D])`` (float32, views of one tensor), RoPE applied to
        q and to the keys (``kv``'s first ``KVH`` heads; the values follow).

        ``x`` is ``[B * T, dim]`` float32, multiplied in ``dtype``; ``cos``/``sin`` are ``[B, T, 1, D]``
        (:func:`rope_tables`)."""
        b, t = cos.shape[:2]
        qkv = self.wqkv(x.to(dtype)).float().view(b, t, -1, self.head_dim)
        qk = qkv[:, :, : self.n_heads + self.n_kv_heads]
        swapped = qk.roll(self.head_dim // 2, dims=-1)
        qk.mul_(cos).addcmul_(swapped, sin)
        q, kv = qkv.split([self.n_heads, 2 * self.n_kv_heads], dim=2)
        return q, kv


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Attention of q ``[B, T, H, D]`` over keys/values ``[B, KVH, L, D]``, as ``[B * T, H * D]``.

    ``bias`` is added to the scaled scores: ``[B, 1, T, L]`` (:func:`attention_bias`), or None when
    every query sees every key."""
    b, t, h, d = q.shape
    out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=bias, enable_gqa=True)
    return out.transpose(1, 2).reshape(b * t, h * d)


def attention_bias(positions: torch.Tensor, length: int) -> torch.Tensor | None:
    """The additive mask for :func:`attend`: the query at position ``p`` sees keys ``<= p``; None
    when that is every key (one row whose last query is at ``length - 1``: a decode step)."""
    b, t = positions.shape
    if b == 1 and t == 1 and int(positions[0, 0]) == length - 1:
        return None
    allowed = torch.arange(length) <= positions.unsqueeze(-1)  # [B, T, L]
    return torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf")).unsqueeze(1)


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.w_gate_up = nn.Linear(config.dim, 2 * config.ffn_dim, bias=False)
        self.w_down = nn.Linear(config.ffn_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``x [rows, dim]`` float32, multiplied in ``dtype``; the result is in ``dtype``."""
        gate, up = self.w_gate_up(x.to(dtype)).chunk(2, dim=-1)
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

    def attention_inputs(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's half before attention: ``(q, kv)`` of the residual ``x [B * T, dim]``
        (see :meth:`Attention.project`)."""
        return self.attn.project(self.attn_norm(x), cos, sin, dtype)

    def finish(self, x: torch.Tensor, attended: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The layer's half after attention: its output ``[B * T, dim]`` from its input ``x`` and the
        attention ``[B * T, H * D]``."""
        x = x + self.attn.wo(attended.to(dtype))
        return x + self.ffn(self.ffn_norm(x), dtype)


class TinyLlama(nn.Module):
    """The decoder.  Use :meth:`forward` with a step of a KV batch, under ``torch.inference_mode()``.

    The residual stream, norms, RoPE and attention are float32; the projections multiply in
    ``matmul_dtype`` (the weights' dtype, or bfloat16 for the packed formats of
    :mod:`schedulers.ar.weight_formats`)."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    matmul_dtype: torch.dtype = torch.float32

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
        """cos/sin ``[B, T, 1, D]`` for ``positions [B, T]``."""
        return self.rope_cos[positions].unsqueeze(2), self.rope_sin[positions].unsqueeze(2)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits of final hidden states ``[..., dim]`` (the projection sees them as ``[rows, dim]``)."""
        rows = hidden.reshape(-1, hidden.shape[-1]).to(self.matmul_dtype)
        return self.lm_head(rows).float().view(*hidden.shape[:-1], -1)

    def forward(
        self, tokens: torch.Tensor, step: KVStep, logits_at: list[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``tokens [B, T]``: row ``b`` continues the ``b``-th row of ``step`` at its length.

        Returns ``(logits [B, T, vocab] float32, hidden [B, T, dim] float32)`` where ``hidden`` is the
        final normed hidden state; with ``logits_at`` (one index into ``T`` per row) logits are
        ``[B, 1, vocab]``, of those positions only (a prefill needs only its last).  Keys/values of
        all ``T`` tokens are written (rows padded on the right write values past their end: the caller
        truncates those rows, see the module docstring).  A row's length + ``T`` must not exceed
        ``max_seq_len``.
        """
        b, t = tokens.shape
        positions = torch.tensor(step.lengths).unsqueeze(1) + torch.arange(t)  # [B, T]
        kv_len = step.width + t
        if kv_len > self.config.max_seq_len:
            raise ValueError(f"sequence length {kv_len} exceeds max_seq_len={self.config.max_seq_len}")
        dtype, kv_heads = self.matmul_dtype, self.config.n_kv_heads
        cos, sin = self.rope_at(positions)
        bias = attention_bias(positions, kv_len)
        x = self.embed(tokens).float().view(b * t, -1)
        for index, layer in enumerate(self.blocks):
            q, kv = layer.attention_inputs(x, cos, sin, dtype)
            # [B, T, 2 * KVH, D] -> [2, B, KVH, T, D]
            new = kv.view(b, t, 2, kv_heads, -1).permute(2, 0, 3, 1, 4)
            keys, values = step.update_stacked(index, new).unbind(0)
            x = layer.finish(x, attend(q, keys, values, bias), dtype)
        hidden = self.norm(x).view(b, t, -1)
        if logits_at is not None:
            picked = hidden[torch.arange(b), torch.tensor(logits_at)].unsqueeze(1)
            return self.logits(picked), hidden
        return self.logits(hidden), hidden

    def forward_full(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T, vocab]`` of a whole sequence with causal attention and no cache (the oracle's path)."""
        b, t = tokens.shape
        cos, sin = self.rope_at(torch.arange(t).expand(b, t))
        x = self.embed(tokens).float().view(b * t, -1)
        for layer in self.blocks:
            q, kv = layer.attention_inputs(x, cos, sin, self.matmul_dtype)
            keys, values = kv.transpose(1, 2).chunk(2, dim=1)
            out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, is_causal=True, enable_gqa=True)
            x = layer.finish(x, out.transpose(1, 2).reshape(b * t, -1), self.matmul_dtype)
        return self.logits(self.norm(x)).view(b, t, -1)


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
    model.matmul_dtype = dtype
    model.rope_cos = model.rope_cos.float()
    model.rope_sin = model.rope_sin.float()
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):  # norms stay float32 (the residual stream is float32)
            param.data = torch.ones_like(param, dtype=torch.float32) if weights is None else weights(name).float()
    return model.eval()
