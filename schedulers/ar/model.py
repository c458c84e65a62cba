"""A tiny Llama-style decoder (RMSNorm, RoPE, GQA attention, SwiGLU) with a per-slot KV cache.

The weights are random, drawn from ``ModelConfig.seed``: two models built from equal configs are
identical, so a test can build its oracle from the same config without sharing objects.

The cache is one preallocated float32 tensor (:class:`KVCache`).  A slot is a request's row;
:meth:`TinyLlama.forward` writes the new keys/values of each row at that row's own start position
and masks attention per row, so requests of different lengths decode in one batch.  Positions at or
beyond a slot's length may hold stale values from an earlier request or from padding: they are never
attended to, because a row only attends to positions ``<=`` its own query position and every
position is written before it is read.

Decoding one token is a few small operations per layer around four matrix products, so the forward
keeps the operation count low: the residual stream stays float32 (only the products' inputs are cast
to the weights' dtype), RoPE is two fused multiplies, attention groups each key/value head's query
heads into one batched product, and a batch of neighbouring slots reads the cache without a copy.
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
    """Preallocated keys/values for ``slots`` sequences; the engine owns slot assignment and lengths.

    ``data`` is ``[layers, 2, slots, kv_heads, max_seq_len, head_dim]``: one layer's keys (or values)
    of consecutive slots are one strided block, so a batch of neighbouring slots reads them without
    a copy."""

    def __init__(self, config: ModelConfig, slots: int, dtype: torch.dtype) -> None:
        shape = (config.n_layers, 2, slots, config.n_kv_heads, config.max_seq_len, config.head_dim)
        self.data = torch.zeros(shape, dtype=dtype)
        self.slots = slots
        self.max_seq_len = config.max_seq_len

    def tokens(self, slot: int, length: int) -> torch.Tensor:
        """The keys/values of a slot's first ``length`` positions (a view)."""
        return self.data[:, :, slot, :, :length]


class RMSNorm(nn.Module):
    """Normalizes float32 input (the residual stream is float32 whatever the weights' format)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``[max_seq_len, head_dim]`` float32 tables: cos over both halves, and sin negated on the first half,
    so RoPE is ``x * cos + swap_halves(x) * sin``."""
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
        self.scale = config.head_dim**-0.5
        self.wqkv = nn.Linear(config.dim, (config.n_heads + 2 * config.n_kv_heads) * config.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q ``[B, T, H, D]``, k and v ``[B, T, KVH, D]`` (float32), RoPE applied to q and k.

        ``x`` is float32, multiplied in ``dtype``; ``cos``/``sin`` are ``[B, T, 1, D]`` (:func:`rope_tables`)."""
        b, t, _ = x.shape
        qkv = self.wqkv(x.to(dtype)).float().view(b, t, -1, self.head_dim)
        qk = qkv[:, :, : self.n_heads + self.n_kv_heads]
        half = self.head_dim // 2
        swapped = torch.cat((qk[..., half:], qk[..., :half]), dim=-1)
        qk = torch.addcmul(qk * cos, swapped, sin)
        return qk[:, :, : self.n_heads], qk[:, :, self.n_heads :], qkv[:, :, self.n_heads + self.n_kv_heads :]

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Attention of q ``[B, T, H, D]`` over keys/values ``[B, KVH, L, D]``, as ``[B, T, H * D]``.

        ``bias`` is added to the scaled scores: ``[B * KVH, 1 or G * T, L]`` with ``G = H / KVH``,
        rows ordered by query head within a key/value head, then by position (:func:`attention_bias`)."""
        b, t, h, d = q.shape
        kvh = self.n_kv_heads
        length = keys.shape[2]
        if t == 1:
            grouped = q.reshape(b * kvh, h // kvh, d)
        else:
            grouped = q.reshape(b, t, kvh, h // kvh, d).permute(0, 2, 3, 1, 4).reshape(b * kvh, -1, d)
        scores = torch.baddbmm(bias, grouped, keys.reshape(b * kvh, length, d).transpose(1, 2), alpha=self.scale)
        out = torch.bmm(torch.softmax(scores, dim=-1), values.reshape(b * kvh, length, d))
        if t == 1:
            return out.view(b, 1, h * d)
        return out.view(b, kvh, h // kvh, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, h * d)


def attention_bias(positions: torch.Tensor, length: int, n_kv_heads: int, group: int) -> torch.Tensor:
    """The additive mask for :meth:`Attention.attend`: the query at position ``p`` sees keys ``<= p``."""
    b, t = positions.shape
    allowed = torch.arange(length) <= positions.unsqueeze(-1)  # [B, T, L]
    bias = torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf"))
    if t == 1:
        return bias.expand(b, n_kv_heads, length).reshape(b * n_kv_heads, 1, length)
    return bias.unsqueeze(1).expand(b, n_kv_heads * group, t, length).reshape(b * n_kv_heads, group * t, length)


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.w_gate_up = nn.Linear(config.dim, 2 * config.ffn_dim, bias=False)
        self.w_down = nn.Linear(config.ffn_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``x`` float32, multiplied in ``dtype``; the result is in ``dtype``."""
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


class TinyLlama(nn.Module):
    """The decoder.  Use :meth:`forward` with a :class:`KVCache`; all calls must run under no-grad.

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
        """Float32 logits of final hidden states."""
        return self.lm_head(hidden.to(self.matmul_dtype)).float()

    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        slots: list[int],
        starts: list[int],
        logits_at: list[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``tokens [B, T]``; row ``b`` continues slot ``slots[b]`` at position ``starts[b]``.

        Returns ``(logits [B, T, vocab] float32, hidden [B, T, dim] float32)`` where ``hidden`` is the
        final normed hidden state; with ``logits_at`` (one index into ``T`` per row) logits are
        ``[B, 1, vocab]``, of those positions only (a prefill needs only its last).  Keys/values of
        all ``T`` tokens are written into the cache (rows padded on the right write values past their
        end: harmless, see the module docstring).  The caller keeps the lengths; ``starts[b] + T``
        must not exceed ``max_seq_len``.
        """
        b, t = tokens.shape
        positions = torch.tensor(starts).unsqueeze(1) + torch.arange(t)  # [B, T]
        kv_len = max(starts) + t
        if kv_len > cache.max_seq_len:
            raise ValueError(f"sequence length {kv_len} exceeds max_seq_len={cache.max_seq_len}")
        config, dtype = self.config, self.matmul_dtype
        cos, sin = self.rope_at(positions)
        bias = attention_bias(positions, kv_len, config.n_kv_heads, config.n_heads // config.n_kv_heads)
        contiguous = slots == list(range(slots[0], slots[0] + b))
        rows = slice(slots[0], slots[0] + b)
        # Unless the rows are neighbouring slots at one start, keys/values go to flat row indices.
        flat = None if contiguous and all(s == starts[0] for s in starts) else _flat_rows(cache, slots, starts, t)
        x = self.embed(tokens).float()
        for layer_cache, layer in zip(cache.data, self.blocks, strict=True):
            q, k, v = layer.attn.project(layer.attn_norm(x), cos, sin, dtype)
            if flat is None:
                layer_cache[0, rows, :, starts[0] : starts[0] + t] = k.transpose(1, 2)
                layer_cache[1, rows, :, starts[0] : starts[0] + t] = v.transpose(1, 2)
            else:
                _write_flat(layer_cache, flat, k, v)
            if contiguous:
                kv = layer_cache[:, rows, :, :kv_len].float()  # [2, B, KVH, L, D], a view when float32
            else:
                kv = torch.stack([layer_cache[:, slot, :, :kv_len] for slot in slots], dim=1).float()
            x = x + layer.attn.wo(layer.attn.attend(q, kv[0], kv[1], bias).to(dtype))
            x = x + layer.ffn(layer.ffn_norm(x), dtype)
        hidden = self.norm(x)
        if logits_at is not None:
            picked = hidden[torch.arange(b), torch.tensor(logits_at)].unsqueeze(1)
            return self.logits(picked), hidden
        return self.logits(hidden), hidden

    def forward_full(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T, vocab]`` of a whole sequence with causal attention and no cache (the oracle's path)."""
        t = tokens.shape[1]
        cos, sin = self.rope_at(torch.arange(t).expand(tokens.shape[0], t))
        x = self.embed(tokens).float()
        for layer in self.blocks:
            q, k, v = layer.attn.project(layer.attn_norm(x), cos, sin, self.matmul_dtype)
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
            )
            x = x + layer.attn.wo(out.transpose(1, 2).flatten(2).to(self.matmul_dtype))
            x = x + layer.ffn(layer.ffn_norm(x), self.matmul_dtype)
        return self.logits(self.norm(x))


def _flat_rows(cache: KVCache, slots: list[int], starts: list[int], t: int) -> torch.Tensor:
    """Row indices ``[B * KVH * T]`` into one layer's keys viewed as ``[slots * KVH * max_seq_len, D]``."""
    heads = cache.data.shape[3]
    slot = torch.tensor(slots).view(-1, 1, 1)
    start = torch.tensor(starts).view(-1, 1, 1)
    return ((slot * heads + torch.arange(heads).view(1, -1, 1)) * cache.max_seq_len + start + torch.arange(t)).view(-1)


def _write_flat(layer_cache: torch.Tensor, flat: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Store new keys/values ``[B, T, KVH, D]`` at the rows :func:`_flat_rows` computed."""
    d = k.shape[-1]
    for part, new in ((0, k), (1, v)):
        source = new.transpose(1, 2).reshape(-1, d).to(layer_cache.dtype)
        layer_cache[part].view(-1, d).index_copy_(0, flat, source)


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
