"""SmolLM2-135M-Instruct decode speed: the served llama.cpp engine beside raw llama.cpp, the torch engine, transformers.

In one run, on the same GGUF file's F16 copy (the weights the default pipeline serves) and thread count:

* **served**: the default pipeline (``configs/speech.toml``, its responder on llama.cpp), text chat
  requests through :func:`omnitrio.open_pipeline`, the end-of-turn token banned with ``logit_bias`` so
  every answer is ``--tokens`` long: batch-1 decode tokens/s (first streamed token to the last),
  8 sessions' total tokens/s while all 8 decode, and time to the first token of a 40-token prompt;
* **raw**: llama-cpp-python's low-level API in a bare loop (one ``llama_batch``, one sequence per
  request, greedy), the same three figures, measured before and after the served run (the mean is
  compared); ``served_vs_raw_*`` are the ratios (the target is >= 0.9);
* **raw_high_level**: llama-cpp-python's ``Llama`` object at batch 1 (it serves one sequence);
* **torch**: the project's own AR engine (float32 and int4 weights from the same file), batch 1 and 8;
* **transformers**: bfloat16, the same file, batch 1.

The load average is printed before and after: the machine may be shared, and a loaded wall-clock
figure is not evidence; ``*_cpu_ms_per_token`` (process CPU time per generated token, with 1 thread
the compute's own) changes much less with load, so ``served_vs_raw_*_cpu_ms_per_token`` (raw's CPU per
token over the served one's) is the comparison a loaded run can make.

Run: ``.venv/bin/python bench/llm.py [--threads 1] [--tokens 48]``.  Figures go to
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

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from schedulers.llamacpp.weights import float_exact_file  # noqa: E402
from schedulers.speech.stages import SMOLLM2_FILE, smollm2_path  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "llm.json"
PROMPTS = [
    "Tell me a long story about a dragon and a knight.",
    "Describe a day at the beach in detail.",
    "Explain how a bicycle works.",
    "Write a letter to a friend about your holiday.",
    "Describe the city of Paris.",
    "Tell me about the history of tea.",
    "Explain how plants grow.",
    "Describe your favourite meal and how to cook it.",
]
LONG_PROMPT = (
    "Please read this and answer briefly: my neighbour's dog barks every night and I cannot sleep, what can I do?"
)


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


# -- raw llama-cpp-python -------------------------------------------------------------------------------------


class Raw:
    """A bare low-level loop: N sequences, one batch per step, greedy."""

    def __init__(self, path: Path, threads: int) -> None:
        from schedulers.llamacpp.model import bindings

        llama = self.llama = bindings()
        self.model = llama.llama_model_load_from_file(str(path).encode(), llama.llama_model_default_params())
        params = llama.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = 4096, 512, 512, 8
        params.n_threads = params.n_threads_batch = threads
        params.kv_unified = True
        self.ctx = llama.llama_init_from_model(self.model, params)
        self.vocab = llama.llama_model_get_vocab(self.model)
        self.batch = llama.llama_batch_init(512, 0, 1)
        self.sampler = llama.llama_sampler_init_greedy()

    def run(self, prompts: list[list[int]], tokens: int) -> tuple[float, list[float]]:
        """(seconds to the first tokens, the decode steps' seconds); ``self.cpu``: the process CPU seconds of
        it all, prefill included (as in the served figure)"""
        llama, batch = self.llama, self.batch
        llama.llama_memory_clear(llama.llama_get_memory(self.ctx), True)
        n = 0
        for seq, ids in enumerate(prompts):
            for pos, token in enumerate(ids):
                self._put(n, token, pos, seq, pos == len(ids) - 1)
                n += 1
        cpu = time.process_time()
        started = time.perf_counter()
        batch.n_tokens = n
        assert llama.llama_decode(self.ctx, batch) == 0
        rows = [sum(len(p) for p in prompts[: i + 1]) - 1 for i in range(len(prompts))]
        last = [llama.llama_sampler_sample(self.sampler, self.ctx, row) for row in rows]
        first = time.perf_counter() - started
        lengths = [len(p) for p in prompts]
        steps = []
        for _ in range(tokens - 1):
            started = time.perf_counter()
            for seq, token in enumerate(last):
                self._put(seq, token, lengths[seq], seq, True)
                lengths[seq] += 1
            batch.n_tokens = len(last)
            assert llama.llama_decode(self.ctx, batch) == 0
            last = [llama.llama_sampler_sample(self.sampler, self.ctx, seq) for seq in range(len(last))]
            steps.append(time.perf_counter() - started)
        self.cpu = time.process_time() - cpu
        return first, steps

    def _put(self, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
        b = self.batch
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
        b.seq_id[i][0] = seq


def prompt_tokens(path: Path) -> tuple[list[list[int]], list[int]]:
    """The bench prompts as the served engine tokenizes them, and the 40-token prompt."""
    from schedulers.llamacpp.chat import LlamaChat
    from schedulers.llamacpp.model import load_model

    model = load_model(path, kv_tokens=256, n_seq_max=1)
    encoder = LlamaChat(model)
    prompts = [encoder.encode_chat(chat(p)) for p in PROMPTS]
    long_ids = encoder.encode_chat(chat(LONG_PROMPT))[-40:]
    model.close()
    return prompts, long_ids


def raw_figures(path: Path, threads: int, tokens: int) -> dict[str, float]:
    prompts, long_ids = prompt_tokens(path)
    raw = Raw(path, threads)
    raw.run(prompts[:1], 4)  # warm-up
    _, one = raw.run(prompts[:1], tokens)
    cpu1 = raw.cpu / tokens
    _, eight = raw.run(prompts, tokens)
    cpu8 = raw.cpu / (8 * tokens)
    prefill = statistics.median(raw.run([long_ids], 1)[0] for _ in range(5))
    return {
        "batch1_tok_s": round(1 / statistics.median(one), 1),
        "sessions8_tok_s": round(8 / statistics.median(eight), 1),
        "prefill40_ms": round(prefill * 1e3, 1),
        "batch1_cpu_ms_per_token": round(cpu1 * 1e3, 2),
        "sessions8_cpu_ms_per_token": round(cpu8 * 1e3, 2),
    }


def raw_high_level(path: Path, threads: int, tokens: int) -> float:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_threads=threads, n_ctx=2048, verbose=False)
    llm.create_completion("The capital of France is", max_tokens=4, temperature=0.0)
    started = time.perf_counter()
    out = llm.create_completion(
        "Once upon a time", max_tokens=tokens, temperature=0.0, logit_bias={llm.token_eos(): -100.0}
    )
    return round(int(out["usage"]["completion_tokens"]) / (time.perf_counter() - started), 1)


# -- served through the pipeline -----------------------------------------------------------------------------


async def served_figures(threads: int, tokens: int, eos: int) -> dict[str, float]:
    from omnitrio import CompleteMessage, open_pipeline
    from omnitrio.cli import DEFAULT_CONFIG
    from omnitrio.config_loading import load

    overrides = [f"responder.factory.threads={threads}"]
    async with open_pipeline(load(DEFAULT_CONFIG, overrides), inline=True) as pipeline:

        async def answer(rid: str, text: str, max_tokens: int, times: list[list[float]]) -> None:
            inputs = {"task": "chat", "messages": chat(text), "max_tokens": max_tokens, "logit_bias": {str(eos): -100}}
            stamps: list[float] = []
            async with pipeline.stream(rid, inputs, params={"stream": True}) as messages:
                async for message in messages:
                    if not isinstance(message, CompleteMessage):
                        stamps.append(time.perf_counter())
            times.append(stamps)

        warm: list[list[float]] = []
        await answer("warm", PROMPTS[0], 4, warm)
        one: list[list[float]] = []
        cpu = time.process_time()
        await answer("one", PROMPTS[0], tokens, one)
        cpu1 = (time.process_time() - cpu) / len(one[0])
        eight: list[list[float]] = []
        cpu = time.process_time()
        async with trio.open_nursery() as nursery:
            for i, text in enumerate(PROMPTS):
                nursery.start_soon(answer, f"eight{i}", text, tokens, eight)
        cpu8 = (time.process_time() - cpu) / sum(map(len, eight))
        firsts = []
        for i in range(5):
            started = time.perf_counter()
            stamps: list[list[float]] = []
            await answer(f"p{i}", LONG_PROMPT, 1, stamps)
            firsts.append((stamps[0][0] if stamps[0] else time.perf_counter()) - started)
    stamps1 = one[0]
    window_start, window_end = max(s[0] for s in eight), min(s[-1] for s in eight)
    in_window = sum(sum(window_start <= t <= window_end for t in s) for s in eight)
    return {
        "batch1_tok_s": round((len(stamps1) - 1) / (stamps1[-1] - stamps1[0]), 1),
        "sessions8_tok_s": round(in_window / max(window_end - window_start, 1e-9), 1),
        "prefill40_ms": round(statistics.median(firsts) * 1e3, 1),
        "chunks_per_answer": round(statistics.mean(len(s) for s in eight), 1),
        "batch1_cpu_ms_per_token": round(cpu1 * 1e3, 2),  # prefill included, as in raw's
        "sessions8_cpu_ms_per_token": round(cpu8 * 1e3, 2),
    }


# -- the torch engine and transformers -----------------------------------------------------------------------


def torch_figures(threads: int, tokens: int) -> dict[str, Any]:
    import torch

    from schedulers.ar.chat_tokenizer import chat_tokenizer
    from schedulers.ar.engine import ARBatchEngine, GenerationRequest
    from schedulers.ar.gguf_file import read_gguf
    from schedulers.ar.weight_formats import load_model

    torch.set_num_threads(threads)
    source = read_gguf(smollm2_path(), max_seq_len=512)
    tokenizer = chat_tokenizer(source)
    prompts = [tokenizer.encode_chat(chat(p)) for p in PROMPTS]
    figures: dict[str, Any] = {}
    for fmt in ("float32", "int4"):
        model = load_model(source, fmt)
        for batch in (1, 8):
            engine = ARBatchEngine(model, max_running_requests=batch)
            for i in range(batch):
                engine.add(GenerationRequest(str(i), prompts[i], tokens))
            engine.step()
            steps = []
            while engine.has_work:
                started = time.perf_counter()
                engine.step()
                steps.append(time.perf_counter() - started)
            figures[f"{fmt}_{'batch1' if batch == 1 else 'sessions8'}_tok_s"] = round(
                batch / statistics.median(steps), 1
            )
    return figures


def transformers_rate(threads: int, tokens: int) -> float | None:
    try:
        import torch
        import transformers
    except ImportError:
        return None
    torch.set_num_threads(threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    directory = str(smollm2_path().parent)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=SMOLLM2_FILE, dtype=torch.bfloat16)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=SMOLLM2_FILE)
    text = tokenizer.apply_chat_template(chat(PROMPTS[0]), add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=2)
        started = time.perf_counter()
        model.generate(ids, max_new_tokens=1, do_sample=False, pad_token_id=2)
        first = time.perf_counter() - started
        started = time.perf_counter()
        out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=2)
        total = time.perf_counter() - started
    return round((out.shape[1] - ids.shape[1] - 1) / (total - first), 1)


def run(args: argparse.Namespace) -> dict[str, Any]:
    path = float_exact_file(smollm2_path())
    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "threads": args.threads,
        "file": path.name,
        "load_avg_before": round(os.getloadavg()[0], 2),
    }
    eos = 2  # SmolLM2's <|im_end|>
    raw = [raw_figures(path, args.threads, args.tokens)]  # before and after the served run: the load drifts
    print("raw llama.cpp", raw[0], flush=True)
    results["served"] = trio.run(served_figures, args.threads, args.tokens, eos)
    print("served", results["served"], flush=True)
    raw.append(raw_figures(path, args.threads, args.tokens))
    print("raw llama.cpp", raw[1], flush=True)
    results["raw"] = {key: round(statistics.mean(r[key] for r in raw), 1) for key in raw[0]}
    results["raw_runs"] = raw
    results["raw_high_level_batch1_tok_s"] = raw_high_level(path, args.threads, args.tokens)
    for key in ("batch1_tok_s", "sessions8_tok_s"):
        results[f"served_vs_raw_{key.removesuffix('_tok_s')}"] = round(results["served"][key] / results["raw"][key], 2)
    for key in ("batch1_cpu_ms_per_token", "sessions8_cpu_ms_per_token"):  # what the load does not change
        results[f"served_vs_raw_{key}"] = round(results["raw"][key] / results["served"][key], 2)
    if not args.skip_torch:
        results["torch"] = torch_figures(args.threads, args.tokens)
        print("torch engine", results["torch"], flush=True)
        results["transformers_bf16_batch1_tok_s"] = transformers_rate(args.threads, args.tokens)
    results["load_avg_after"] = round(os.getloadavg()[0], 2)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=48, help="tokens per answer")
    parser.add_argument("--skip-torch", action="store_true", help="leave out the torch engine and transformers")
    results = run(parser.parse_args())
    print(json.dumps(results, indent=2))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
