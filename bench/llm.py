"""SmolLM2-135M-Instruct on the AR engine: decode speed against the memory-bandwidth limit, and agreement.

In one run, per weight format (``float32``, ``bfloat16``, ``int8``, ``int4``):

* **batch-1 decode**: tokens/s of one greedy request on the engine, next to the limit
  ``measured bandwidth / bytes read per token`` (every projection's weights, the output projection
  included; the embedding row and the KV cache are left out);
* **8 sessions**: total tokens/s of 8 requests decoding together;
* **prefill**: milliseconds to the first token of a 40-token prompt (chat time to first token);
* **agreement**: the share of positions where the format's next token equals float32's, teacher-forced
  along float32's greedy answers to a fixed prompt set;
* **products only** (``products_only_*``): the same three figures from the matrix products alone
  (every projection and the output projection, same shapes, same threads): what the weight kernels
  allow if everything around them cost nothing;
* **one core's floor** (``cpu1_*``): CPU milliseconds (``time.thread_time``, one torch thread) of a
  decode step at batch 1 and 8 and of the 40-token prefill, next to the CPU milliseconds of their
  matrix products alone (every projection and the output projection, same shapes).  CPU time is
  what the work costs whatever else runs on the machine; wall-clock figures are not, on a shared one.

Also, when installed, transformers (bfloat16, the same GGUF file) at batch 1, and llama.cpp
(``llama-cpp-python``) on the same file.  Bandwidth is a 256 MB tensor copy (read + write) at the
same thread count.  The load average is printed: the machine may be shared.  OpenMP's idle workers
sleep (``OMP_WAIT_POLICY=PASSIVE`` unless set), as in ``python -m omnitrio serve``.

Run: ``.venv/bin/python bench/llm.py [--threads 2] [--formats int4 int8 ...]``.  Figures go to
``bench/results/llm.json``.  Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads OpenMP

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from schedulers.ar.chat_tokenizer import ChatTokenizer, chat_tokenizer  # noqa: E402
from schedulers.ar.engine import ARBatchEngine, GenerationRequest  # noqa: E402
from schedulers.ar.gguf_file import GGUFModel, read_gguf  # noqa: E402
from schedulers.ar.model import TinyLlama  # noqa: E402
from schedulers.ar.weight_formats import WEIGHT_FORMATS, load_model  # noqa: E402
from schedulers.speech.stages import SMOLLM2_FILE, smollm2_path  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "llm.json"
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "How many legs does a spider have?",
    "Give me three tips for sleeping well.",
    "What is 12 plus 30?",
    "Explain what a noun is.",
    "Name a fruit that is yellow.",
    "Why is the sky blue?",
]
LONG_PROMPT = (
    "Please read this and answer briefly: my neighbour's dog barks every night and I cannot sleep, what can I do?"
)


def bandwidth_gb_s() -> float:
    src = torch.ones(64 << 20)  # 256 MB of float32
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(5):
        started = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - started)
    return 2 * src.nbytes / min(times) / 1e9


def bytes_per_token(model: TinyLlama) -> int:
    """Bytes of every tensor a decode step reads whole: all but the embedding table (one row of it
    is read) and the RoPE tables; a tied output projection counts once."""
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers()]
    read = {t.data_ptr(): t.nbytes for name, t in named if not name.startswith(("embed", "rope"))}
    return sum(read.values())


def chat(tokenizer: ChatTokenizer, text: str) -> list[int]:
    return tokenizer.encode_chat([{"role": "user", "content": text}])


def decode_rate(model: TinyLlama, prompts: list[list[int]], tokens: int) -> float:
    """Tokens/s of decode steps only (prefill excluded), all prompts in one batch."""
    engine = ARBatchEngine(model, max_running_requests=len(prompts))
    for i, ids in enumerate(prompts):
        engine.add(GenerationRequest(str(i), ids, tokens))
    engine.step()  # the prefill
    steps = []
    while engine.has_work:
        started = time.perf_counter()
        _, stats = engine.step()
        steps.append((time.perf_counter() - started, stats.batch_size))
    seconds = statistics.median(s for s, _ in steps)
    return len(prompts) / seconds


def prefill_ms(model: TinyLlama, ids: list[int]) -> float:
    times = []
    for i in range(5):
        engine = ARBatchEngine(model, max_running_requests=1)
        engine.add(GenerationRequest(f"p{i}", ids, 1))
        started = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def cpu_ms(work: Any, rounds: int) -> float:
    """Median CPU milliseconds of ``work()`` on this thread, after one warm-up call."""
    work()
    times = []
    for _ in range(rounds):
        started = time.thread_time()
        work()
        times.append(time.thread_time() - started)
    return statistics.median(times) * 1e3


def matmuls(model: TinyLlama, rows: int, head_rows: int) -> Any:
    """The matrix products of one forward over ``rows`` tokens (the output projection over ``head_rows``)."""
    dtype = model.matmul_dtype
    x = torch.randn(rows, model.config.dim).to(dtype)
    inner = torch.randn(rows, model.config.ffn_dim).to(dtype)
    head = x[:head_rows]

    def work() -> None:
        for block in model.blocks:
            block.attn.wqkv(x)
            block.attn.wo(x)
            block.ffn.w_gate_up(x)
            block.ffn.w_down(inner)
        model.lm_head(head)

    return work


def products_floor(model: TinyLlama, long_ids: list[int]) -> dict[str, float]:
    """Wall figures of the matrix products alone at the run's thread count: the most each target
    could reach if everything around the products cost nothing."""
    figures = {}
    with torch.inference_mode():
        for batch in (1, 8):
            work = matmuls(model, batch, batch)
            work()
            seconds = statistics.median(_wall(work) for _ in range(7))
            figures[f"products_only_b{batch}_tok_s"] = round(batch / seconds, 1)
        work = matmuls(model, len(long_ids), 1)
        work()
        figures["products_only_prefill40_ms"] = round(statistics.median(_wall(work) for _ in range(3)) * 1e3, 1)
    return figures


def _wall(work: Any) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def one_core_floor(model: TinyLlama, prompts: list[list[int]], long_ids: list[int]) -> dict[str, float]:
    """CPU ms at one thread: decode steps (batch 1 and 8), the 40-token prefill, and their products alone."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    figures = {}
    with torch.inference_mode():
        for batch in (1, 8):
            engine = ARBatchEngine(model, max_running_requests=batch)
            for i in range(batch):
                engine.add(GenerationRequest(f"f{i}", prompts[i % len(prompts)], 64))
            engine.step()
            figures[f"cpu1_step_b{batch}_ms"] = round(cpu_ms(engine.step, 20), 2)
            figures[f"cpu1_matmuls_b{batch}_ms"] = round(cpu_ms(matmuls(model, batch, batch), 10), 2)

        def prefill() -> None:
            engine = ARBatchEngine(model, max_running_requests=1)
            engine.add(GenerationRequest("p", long_ids, 1))
            engine.step()

        figures["cpu1_prefill40_ms"] = round(cpu_ms(prefill, 3), 1)
        figures["cpu1_matmuls_prefill40_ms"] = round(cpu_ms(matmuls(model, len(long_ids), 1), 3), 1)
    torch.set_num_threads(threads)
    return figures


def greedy_answers(model: TinyLlama, prompts: list[list[int]], tokens: int, eos: int) -> list[list[int]]:
    engine = ARBatchEngine(model, max_running_requests=len(prompts))
    for i, ids in enumerate(prompts):
        engine.add(GenerationRequest(str(i), ids, tokens, eos_token_id=eos))
    outputs: dict[str, list[int]] = {}
    while engine.has_work:
        events, _ = engine.step()
        for event in events:
            outputs.setdefault(event.request_id, []).append(event.token_id)
    return [outputs[str(i)] for i in range(len(prompts))]


def agreement(model: TinyLlama, prompts: list[list[int]], answers: list[list[int]]) -> float:
    """Share of positions where ``model``'s argmax equals the reference answer's next token."""
    same = total = 0
    with torch.inference_mode():
        for ids, answer in zip(prompts, answers, strict=True):
            sequence = torch.tensor([ids + answer[:-1]])
            logits = model.forward_full(sequence)[0, len(ids) - 1 :]
            picked = logits.argmax(-1).tolist()
            same += sum(int(a == b) for a, b in zip(picked, answer, strict=True))
            total += len(answer)
    return same / total


def transformers_rate(ids: list[int], tokens: int) -> float | None:
    try:
        import transformers
    except ImportError:
        return None
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(smollm2_path().parent), gguf_file=SMOLLM2_FILE, dtype=torch.bfloat16
    ).eval()
    with torch.inference_mode():
        prompt = torch.tensor([ids])
        model.generate(prompt, max_new_tokens=2, do_sample=False, pad_token_id=2)
        started = time.perf_counter()
        model.generate(prompt, max_new_tokens=1, do_sample=False, pad_token_id=2)
        first = time.perf_counter() - started
        started = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=2)
        total = time.perf_counter() - started
    return (out.shape[1] - len(ids) - 1) / (total - first)


def llama_cpp_rate(tokens: int, threads: int) -> float | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(model_path=str(smollm2_path()), n_threads=threads, verbose=False)
    started = time.perf_counter()
    out = llm.create_completion("The capital of France is", max_tokens=tokens, temperature=0.0)
    return int(out["usage"]["completion_tokens"]) / (time.perf_counter() - started)


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    source: GGUFModel = read_gguf(smollm2_path(), max_seq_len=512)
    tokenizer = chat_tokenizer(source)
    prompts = [chat(tokenizer, text) for text in PROMPTS]
    long_ids = chat(tokenizer, LONG_PROMPT)[-40:]
    bandwidth = bandwidth_gb_s()
    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "torch_threads": args.threads,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "load_avg_before": round(os.getloadavg()[0], 2),
        "bandwidth_gb_s": round(bandwidth, 1),
        "formats": {},
    }
    reference = load_model(source, "float32")
    answers = greedy_answers(reference, prompts, args.answer_tokens, tokenizer.eos_token_id)
    for fmt in args.formats:
        model = reference if fmt == "float32" else load_model(source, fmt)
        per_token = bytes_per_token(model)
        row = {
            "bytes_per_token_mb": round(per_token / 1e6, 1),
            "limit_tok_s": round(bandwidth * 1e9 / per_token, 1),
            "batch1_tok_s": round(decode_rate(model, prompts[:1], args.tokens), 1),
            "sessions8_tok_s": round(decode_rate(model, prompts, args.tokens), 1),
            "prefill40_ms": round(prefill_ms(model, long_ids), 1),
            "agreement_vs_float32": round(agreement(model, prompts, answers), 4),
            **products_floor(model, long_ids),
            **one_core_floor(model, prompts, long_ids),
            "load_avg": round(os.getloadavg()[0], 2),
        }
        results["formats"][fmt] = row
        print(fmt, row, flush=True)
    transformers = transformers_rate(prompts[0], args.tokens)
    results["transformers_bf16_tok_s"] = transformers
    if transformers:  # the targets as ratios to transformers at batch 1, measured in this run
        for row in results["formats"].values():
            row["batch1_vs_transformers"] = round(row["batch1_tok_s"] / transformers, 2)
            row["sessions8_vs_transformers"] = round(row["sessions8_tok_s"] / transformers, 2)
    results["llama_cpp_tok_s"] = llama_cpp_rate(args.tokens, args.threads)
    results["load_avg_after"] = round(os.getloadavg()[0], 2)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=48, help="decode steps per measurement")
    parser.add_argument("--answer-tokens", type=int, default=24, help="float32 answer length for agreement")
    parser.add_argument("--formats", nargs="+", default=list(WEIGHT_FORMATS), choices=WEIGHT_FORMATS)
    results = run(parser.parse_args())
    print(json.dumps(results, indent=2))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
