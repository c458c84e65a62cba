"""Plain torch decode loops: the engine's test oracle and its benchmark baseline.

* :func:`greedy_reference` recomputes the whole sequence each step with ordinary causal attention
  and no cache — slow, but it shares none of the engine's cache, masking or position code, so an
  engine that matches it token for token has those right.
* :func:`handwritten_decode` is the loop one would write by hand for a static batch of equal-length
  prompts: a contiguous cache, no scheduling, no masks.  It is the yardstick for the engine's speed.
"""

from __future__ import annotations

import statistics
import time

import torch

from schedulers.ar.model import TinyLlama, attend, attention_bias


def greedy_reference(
    model: TinyLlama, prompt: list[int], max_new_tokens: int, eos_token_id: int | None = None
) -> list[int]:
    """Greedy continuation of one prompt, stopping after ``eos_token_id`` (included) or ``max_new_tokens``."""
    tokens = list(prompt)
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            logits = model.forward_full(torch.tensor([tokens]))
            token = int(logits[0, -1].argmax())
            out.append(token)
            tokens.append(token)
            if token == eos_token_id:
                break
    return out


def handwritten_decode(model: TinyLlama, prompts: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Greedy decode of a static batch ``prompts [B, P]``; returns the new tokens ``[B, max_new_tokens]``."""
    config = model.config
    batch, prompt_len = prompts.shape
    total = prompt_len + max_new_tokens
    dtype = model.matmul_dtype
    caches = [torch.zeros(2, batch, config.n_kv_heads, total, config.head_dim) for _ in range(config.n_layers)]
    out = torch.empty(batch, max_new_tokens, dtype=torch.long)
    with torch.inference_mode():
        tokens = prompts
        pos = 0
        for step in range(max_new_tokens):
            t = tokens.shape[1]
            positions = torch.arange(pos, pos + t).expand(batch, t)
            cos, sin = model.rope_at(positions)
            bias = attention_bias(positions, pos + t)
            x = model.embed(tokens).float().view(batch * t, -1)
            for layer, cache in zip(model.blocks, caches, strict=True):
                q, kv = layer.attention_inputs(x, cos, sin, dtype)
                cache[:, :, :, pos : pos + t] = kv.view(batch, t, 2, config.n_kv_heads, -1).permute(2, 0, 3, 1, 4)
                keys, values = cache[0, :, :, : pos + t], cache[1, :, :, : pos + t]
                x = layer.finish(x, attend(q, keys, values, bias), dtype)
            logits = model.logits(model.norm(x.view(batch, t, -1)[:, -1]))
            tokens = logits.argmax(-1, keepdim=True)
            out[:, step] = tokens[:, 0]
            pos += t
    return out


def handwritten_tokens_per_second(
    model: TinyLlama, batch_size: int, prompt_len: int = 16, max_new_tokens: int = 64, seed: int = 0
) -> float:
    """Generated tokens per second of :func:`handwritten_decode` (prefill included, one warm-up run)."""
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, model.config.vocab_size, (batch_size, prompt_len), generator=generator)
    handwritten_decode(model, prompts, 4)
    start = time.perf_counter()
    handwritten_decode(model, prompts, max_new_tokens)
    return batch_size * max_new_tokens / (time.perf_counter() - start)


def engine_tokens_per_second(
    model: TinyLlama, batch_size: int, prompt_len: int = 16, max_new_tokens: int = 64, seed: int = 0
) -> tuple[float, int]:
    """Generated tokens per second of the engine on the same workload; also the largest batch it ran."""
    from schedulers.ar.engine import ARBatchEngine, GenerationRequest

    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, model.config.vocab_size, (batch_size, prompt_len), generator=generator).tolist()
    engine = ARBatchEngine(model, max_running_requests=batch_size)

    def run(new_tokens: int) -> int:
        for i, prompt in enumerate(prompts):
            engine.add(GenerationRequest(f"bench-{new_tokens}-{i}", prompt, new_tokens))
        largest = 0
        while engine.has_work:
            _, stats = engine.step()
            largest = max(largest, stats.batch_size)
        return largest

    run(4)
    start = time.perf_counter()
    largest = run(max_new_tokens)
    return batch_size * max_new_tokens / (time.perf_counter() - start), largest


def measure_tokens_per_second(
    batch_size: int,
    *,
    dtype: torch.dtype = torch.float32,
    prompt_len: int = 16,
    max_new_tokens: int = 64,
    rounds: int = 5,
) -> dict[str, float]:
    """Tokens/s of the engine and of the hand-written loop on one workload (medians), and their ratio."""
    from schedulers.ar.model import ModelConfig, build_model

    model = build_model(ModelConfig(), dtype)
    # Alternate the two, several rounds, and compare medians: on a shared machine one run of
    # each is mostly noise (ratios from 0.77 to 1.05 for the same code were seen).
    baselines, engines, largest = [], [], 0
    for _ in range(rounds):
        baselines.append(handwritten_tokens_per_second(model, batch_size, prompt_len, max_new_tokens))
        engine, largest = engine_tokens_per_second(model, batch_size, prompt_len, max_new_tokens)
        engines.append(engine)
    baseline, engine = statistics.median(baselines), statistics.median(engines)
    return {"engine": engine, "handwritten": baseline, "ratio": engine / baseline, "batch": float(largest)}
