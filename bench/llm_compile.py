"""Does ``torch.compile`` (inductor, CPU) take the per-operation overhead out of a SmolLM2 decode step?

A decode step is four packed products per layer (int4/int8 weight-only kernels) and some 25 small
operations around them (norms, RoPE, attention, casts, cache writes), over 30 layers.  This compiles
each layer's decode into two inductor graphs, shared by all 30 layers: before the cache write (norm,
QKV product, RoPE) and after it (attention, output product, residual, norm, feed-forward).  The cache
write stays eager: inside a graph, inductor copies the whole layer's cache to write one position.
Prefill stays eager.  Shapes are dynamic (batch and kv length), so one graph pair serves every step.

In one run, eager and compiled interleaved (``--rounds`` times), per weight format:

* ``cpu1_step_b{1,8}_ms``: one-thread CPU milliseconds of a decode step (median);
* ``wall_b1_tok_s``: batch-1 decode tokens/s at ``--threads``;
* ``compile_cold_s`` / ``compile_warm_s``: the first steps' extra wall time with an empty inductor
  cache directory, and again in a fresh process state with that directory filled;
* ``graphs_over_200_tokens``: graphs compiled during a 200-token generation after the warm-up
  (0 means no recompiles);
* ``greedy_equal_b1`` / ``greedy_equal_b8``: whether the compiled greedy tokens equal eager's on
  bench/llm.py's prompts (one request, then all 8 together);
* ``per_call_us``: one-thread CPU microseconds of one layer's two halves at batch 1, eager and
  compiled, of that layer's products alone, and of ``x + 1`` eager and compiled (the fixed cost of
  calling a compiled graph).

Run: ``.venv/bin/python bench/llm_compile.py [--formats int4 float32]``.  Figures go to
``bench/results/llm_compile.json``.  Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads OpenMP

import torch
import torch._dynamo

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.llm import PROMPTS, chat  # noqa: E402
from schedulers.ar import model as ar_model  # noqa: E402
from schedulers.ar.chat_tokenizer import chat_tokenizer  # noqa: E402
from schedulers.ar.engine import ARBatchEngine, GenerationRequest  # noqa: E402
from schedulers.ar.gguf_file import read_gguf  # noqa: E402
from schedulers.ar.model import Block, TinyLlama  # noqa: E402
from schedulers.ar.weight_formats import WEIGHT_FORMATS, load_model  # noqa: E402
from schedulers.engine.kv_batch import KVStep  # noqa: E402
from schedulers.speech.stages import smollm2_path  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "llm_compile.json"


def _before_write(
    layer: Block, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    return layer.attention_inputs(x, cos, sin, dtype)


def _after_write(
    layer: Block, x: torch.Tensor, q: torch.Tensor, kv: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    return layer.finish(x, ar_model.attend(q, kv[0], kv[1], bias), dtype)


class CompiledDecode:
    """``model.forward`` with decode steps through the two compiled graphs (the KV batch's write stays eager)."""

    def __init__(self, model: TinyLlama) -> None:
        self.model = model
        self.eager = model.forward
        self.before = torch.compile(_before_write, dynamic=True)
        self.after = torch.compile(_after_write, dynamic=True)

    def __call__(
        self, tokens: torch.Tensor, step: KVStep, logits_at: list[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        b, t = tokens.shape
        if t != 1 or logits_at is not None:
            return self.eager(tokens, step, logits_at)
        model, config, dtype = self.model, self.model.config, self.model.matmul_dtype
        positions = torch.tensor(step.lengths).unsqueeze(1)
        cos, sin = model.rope_at(positions)
        bias = ar_model.attention_bias(positions, step.width + 1)
        x = model.embed(tokens).float().view(b, -1)
        for index, layer in enumerate(model.blocks):
            q, kv = self.before(layer, x, cos, sin, dtype)
            keys_values = step.update_stacked(index, kv.view(b, 1, 2, config.n_kv_heads, -1).permute(2, 0, 3, 1, 4))
            x = self.after(layer, x, q, keys_values, bias, dtype)
        hidden = model.norm(x).view(b, 1, -1)
        return model.logits(hidden), hidden


def generate(model: TinyLlama, prompts: list[list[int]], tokens: int) -> tuple[list[list[int]], list[float]]:
    """Greedy tokens of all prompts decoded together, and each step's (wall, CPU) seconds after the prefill."""
    engine = ARBatchEngine(model, max_running_requests=len(prompts))
    for i, ids in enumerate(prompts):
        engine.add(GenerationRequest(str(i), ids, tokens))
    outputs: dict[str, list[int]] = {}
    cpu: list[float] = []
    while engine.has_work:
        started = time.thread_time()
        events, _ = engine.step()
        cpu.append(time.thread_time() - started)
        for event in events:
            outputs.setdefault(event.request_id, []).append(event.token_id)
    return [outputs[str(i)] for i in range(len(prompts))], cpu[1:]


def wall_tok_s(model: TinyLlama, ids: list[int], tokens: int) -> float:
    engine = ARBatchEngine(model, max_running_requests=1)
    engine.add(GenerationRequest("w", ids, tokens))
    engine.step()
    steps = []
    while engine.has_work:
        started = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - started)
    return 1 / statistics.median(steps)


def unique_graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def per_call_us(model: TinyLlama) -> dict[str, float]:
    """One-thread CPU microseconds of layer 0's halves (batch 1, 51 cached tokens), eager and compiled."""
    layer, dtype = model.blocks[0], model.matmul_dtype
    x = torch.randn(1, model.config.dim)
    cos, sin = model.rope_at(torch.tensor([[50]]))
    kv = torch.randn(2, 1, model.config.n_kv_heads, 51, model.config.head_dim)
    bias = None  # one row at the last position sees every key
    inner = torch.randn(1, model.config.ffn_dim).to(dtype)
    before = torch.compile(_before_write, dynamic=True)
    after = torch.compile(_after_write, dynamic=True)
    plus_one = torch.compile(lambda a: a + 1, dynamic=True)
    q, _ = _before_write(layer, x, cos, sin, dtype)
    work = {
        "before_eager": lambda: _before_write(layer, x, cos, sin, dtype),
        "before_compiled": lambda: before(layer, x, cos, sin, dtype),
        "after_eager": lambda: _after_write(layer, x, q, kv, bias, dtype),
        "after_compiled": lambda: after(layer, x, q, kv, bias, dtype),
        "products_alone": lambda: (
            layer.attn.wqkv(x.to(dtype)),
            layer.attn.wo(x.to(dtype)),
            layer.ffn.w_gate_up(x.to(dtype)),
            layer.ffn.w_down(inner),
        ),
        "x_plus_1_eager": lambda: x + 1,
        "x_plus_1_compiled": lambda: plus_one(x),
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    figures = {}
    for name, call in work.items():
        call()
        times = []
        for _ in range(300):
            started = time.thread_time()
            call()
            times.append(time.thread_time() - started)
        figures[name] = round(statistics.median(times) * 1e6, 1)
    torch.set_num_threads(threads)
    return figures


def measure(fmt: str, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    source = read_gguf(smollm2_path(), max_seq_len=512)
    model = load_model(source, fmt)
    eager = model.forward
    compiled = CompiledDecode(model)
    row: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as cache_dir:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
        for label in ("cold", "warm"):
            torch._dynamo.reset()
            compiled = CompiledDecode(model)
            model.forward = eager  # type: ignore[method-assign]
            started = time.perf_counter()
            generate(model, prompts[:1], 4)
            generate(model, prompts, 4)
            eager_s = time.perf_counter() - started
            model.forward = compiled  # type: ignore[method-assign]
            started = time.perf_counter()
            generate(model, prompts[:1], 4)
            generate(model, prompts, 4)
            row[f"compile_{label}_s"] = round(time.perf_counter() - started - eager_s, 1)
        del os.environ["TORCHINDUCTOR_CACHE_DIR"]
    graphs = unique_graphs()
    generate(model, prompts[:1], 200)
    row["graphs_over_200_tokens"] = unique_graphs() - graphs
    figures: dict[str, dict[str, list[float]]] = {"eager": {}, "compiled": {}}
    answers: dict[str, dict[int, list[list[int]]]] = {"eager": {}, "compiled": {}}
    for _ in range(args.rounds):
        for label, forward in (("eager", eager), ("compiled", compiled)):
            model.forward = forward  # type: ignore[method-assign]
            torch.set_num_threads(1)
            for batch in (1, 8):
                tokens, cpu = generate(model, prompts[:batch], args.tokens)
                answers[label][batch] = tokens
                figures[label].setdefault(f"cpu1_step_b{batch}_ms", []).append(statistics.median(cpu) * 1e3)
            torch.set_num_threads(args.threads)
            figures[label].setdefault("wall_b1_tok_s", []).append(wall_tok_s(model, prompts[0], args.tokens))
    model.forward = eager  # type: ignore[method-assign]
    with torch.inference_mode():
        row["per_call_us"] = per_call_us(model)
    for label, series in figures.items():
        row[label] = {name: round(statistics.median(values), 2) for name, values in series.items()}
    for batch in (1, 8):
        row[f"greedy_equal_b{batch}"] = answers["eager"][batch] == answers["compiled"][batch]
    row["step_speedup_b1"] = round(row["eager"]["cpu1_step_b1_ms"] / row["compiled"]["cpu1_step_b1_ms"], 3)
    row["step_speedup_b8"] = round(row["eager"]["cpu1_step_b8_ms"] / row["compiled"]["cpu1_step_b8_ms"], 3)
    row["load_avg"] = round(os.getloadavg()[0], 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=40, help="decode steps per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="eager/compiled alternations")
    parser.add_argument("--formats", nargs="+", default=["int4", "float32"], choices=WEIGHT_FORMATS)
    args = parser.parse_args()
    source = read_gguf(smollm2_path(), max_seq_len=512)
    tokenizer = chat_tokenizer(source)
    prompts = [chat(tokenizer, text) for text in PROMPTS]
    results: dict[str, Any] = {
        "compiled_as": "two dynamic-shape graphs per layer (before/after the eager cache write), decode only",
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "torch_threads": args.threads,
        "load_avg_before": round(os.getloadavg()[0], 2),
        "formats": {},
    }
    for fmt in args.formats:
        results["formats"][fmt] = measure(fmt, prompts, args)
        print(fmt, results["formats"][fmt], flush=True)
    results["load_avg_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(results, indent=2))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
