"""The continuous-batching engine decodes exactly what a plain torch loop decodes."""

from __future__ import annotations

import pytest
import torch

from omnitrio.contract import StageOverloaded
from schedulers.ar.engine import ARBatchEngine, GenerationRequest, TokenEvent
from schedulers.ar.model import ModelConfig, build_model
from schedulers.ar.reference import greedy_reference, handwritten_decode
from schedulers.ar.tokenizer import load_tokenizer

torch.set_num_threads(1)

CONFIG = ModelConfig(vocab_size=512, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=256, max_seq_len=96)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return build_model(CONFIG)


def prompt(length: int, salt: int) -> list[int]:
    return [(7 * i + 13 * salt) % (CONFIG.vocab_size - 1) + 1 for i in range(length)]


def run_to_end(engine: ARBatchEngine) -> dict[str, list[int]]:
    outputs: dict[str, list[int]] = {}
    while engine.has_work:
        events, _ = engine.step()
        collect(events, outputs)
    return outputs


def collect(events: list[TokenEvent], outputs: dict[str, list[int]]) -> None:
    for event in events:
        outputs.setdefault(event.request_id, []).append(event.token_id)


def test_batched_prompts_of_different_lengths_decode_like_the_reference_loop(model) -> None:
    engine = ARBatchEngine(model, max_running_requests=5)
    prompts = {f"r{n}": prompt(n, n) for n in (1, 3, 7, 12, 20)}
    for rid, ids in prompts.items():
        engine.add(GenerationRequest(rid, ids, max_new_tokens=10))
    outputs = run_to_end(engine)
    assert outputs == {rid: greedy_reference(model, ids, 10) for rid, ids in prompts.items()}


def test_requests_joining_a_running_batch_and_gaps_between_slots_keep_outputs_exact(model) -> None:
    engine = ARBatchEngine(model, max_running_requests=4)
    prompts = {"a": prompt(4, 1), "b": prompt(9, 2), "c": prompt(2, 3), "d": prompt(6, 4), "e": prompt(11, 5)}
    for rid in "abcd":
        engine.add(GenerationRequest(rid, prompts[rid], max_new_tokens=12))
    outputs: dict[str, list[int]] = {}
    for _ in range(3):
        collect(engine.step()[0], outputs)
    assert engine.abort("b")  # slots 0, 2, 3 keep decoding: a non-contiguous batch
    for _ in range(2):
        collect(engine.step()[0], outputs)
    engine.add(GenerationRequest("e", prompts["e"], max_new_tokens=12))  # joins mid-decode, in slot 1
    while engine.has_work:
        collect(engine.step()[0], outputs)
    del outputs["b"]
    assert outputs == {rid: greedy_reference(model, prompts[rid], 12) for rid in "acde"}


def test_every_step_gives_each_running_request_one_token(model) -> None:
    engine = ARBatchEngine(model, max_running_requests=3)
    for i in range(3):
        engine.add(GenerationRequest(f"r{i}", prompt(3 + i, i), max_new_tokens=5))
    sizes = []
    while engine.has_work:
        events, stats = engine.step()
        assert len(events) == stats.batch_size
        sizes.append(stats.batch_size)
    assert sizes == [3] * 5


def test_eos_ends_a_request_and_frees_its_slot(model) -> None:
    ids = prompt(5, 9)
    expected = greedy_reference(model, ids, 6)
    engine = ARBatchEngine(model, max_running_requests=1)
    engine.add(GenerationRequest("stops", ids, max_new_tokens=6, eos_token_id=expected[2]))
    engine.add(GenerationRequest("next", ids, max_new_tokens=1))
    finished = {}
    while engine.has_work:
        for event in engine.step()[0]:
            if event.finish_reason is not None:
                finished[event.request_id] = (event.finish_reason, event.output_ids)
    assert finished == {"stops": ("stop", expected[:3]), "next": ("length", expected[:1])}


def test_full_waiting_queue_raises_stage_overloaded(model) -> None:
    engine = ARBatchEngine(model, max_running_requests=1, max_waiting_requests=2)
    for rid in "abc":  # one takes the free slot, two wait
        engine.add(GenerationRequest(rid, [1], 1))
    with pytest.raises(StageOverloaded, match="waiting queue is full"):
        engine.add(GenerationRequest("d", [1], 1))


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (GenerationRequest("x", [], 4), "prompt is empty"),
        (GenerationRequest("x", [CONFIG.vocab_size], 4), "prompt token ids must be in"),
        (GenerationRequest("x", [1] * 90, 10), "maximum context length is 96 tokens"),
        (GenerationRequest("x", [1], 0), "max_new_tokens=0"),
    ],
)
def test_invalid_requests_are_rejected_naming_the_problem(model, request_, message) -> None:
    with pytest.raises(ValueError, match=message):
        ARBatchEngine(model).add(request_)


def test_hidden_states_are_returned_one_per_generated_token(model) -> None:
    engine = ARBatchEngine(model, max_running_requests=2)
    engine.add(GenerationRequest("h", prompt(4, 0), max_new_tokens=5, return_hidden_states=True))
    last = None
    while engine.has_work:
        for event in engine.step()[0]:
            last = event
    assert last is not None and last.hidden_states is not None
    assert last.hidden_states.shape == (5, CONFIG.dim)


def test_bfloat16_engine_decodes_the_requested_number_of_tokens() -> None:
    engine = ARBatchEngine(build_model(CONFIG, torch.bfloat16), max_running_requests=2)
    engine.add(GenerationRequest("a", prompt(3, 0), max_new_tokens=4))
    engine.add(GenerationRequest("b", prompt(8, 1), max_new_tokens=6))
    outputs = run_to_end(engine)
    assert {rid: len(ids) for rid, ids in outputs.items()} == {"a": 4, "b": 6}


def test_handwritten_loop_matches_the_full_recompute_oracle(model) -> None:
    ids = prompt(6, 3)
    assert handwritten_decode(model, torch.tensor([ids]), 8)[0].tolist() == greedy_reference(model, ids, 8)


def test_tokenizer_round_trips_any_utf8_text() -> None:
    tokenizer = load_tokenizer()
    text = "Hello, world! naïve café — 世界 🎉\n\ttabs"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.eos_token_id not in tokenizer.encode(text)
