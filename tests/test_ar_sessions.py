"""A conversation keeps its KV cache between turns; shared prompt prefixes are computed once."""

from __future__ import annotations

import pytest
import torch

from schedulers.ar.engine import ARBatchEngine, GenerationRequest
from schedulers.ar.model import ModelConfig, build_model
from schedulers.ar.reference import greedy_reference
from tests.test_ar_engine import prompt, run_to_end

torch.set_num_threads(1)

CONFIG = ModelConfig(vocab_size=512, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=256, max_seq_len=128)
SYSTEM = prompt(12, 99)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return build_model(CONFIG)


def turn(engine: ARBatchEngine, rid: str, ids: list[int], session: str | None, shared: int = 0) -> list[int]:
    engine.add(GenerationRequest(rid, ids, 6, session_id=session, shared_prefix_len=shared))
    return run_to_end(engine)[rid]


def test_a_new_turn_prefills_only_its_new_tokens_and_answers_as_from_scratch(model: torch.nn.Module) -> None:
    engine = ARBatchEngine(model, max_running_requests=2, max_sessions=4)
    first = [*SYSTEM, *prompt(5, 1)]
    answer = turn(engine, "t1", first, "s")
    second = [*first, *answer, *prompt(4, 2)]
    before = engine.prefilled_tokens
    assert turn(engine, "t2", second, "s") == greedy_reference(model, second, 6)
    # Everything but the answer's last token (never fed back) and the new user text was cached.
    assert engine.prefilled_tokens - before == 1 + 4


def test_an_edited_history_reuses_only_the_common_prefix(model: torch.nn.Module) -> None:
    engine = ARBatchEngine(model, max_running_requests=1, max_sessions=2)
    first = [*SYSTEM, *prompt(6, 3)]
    turn(engine, "t1", first, "s")
    edited = [*first[:-3], *prompt(5, 4)]  # the client rewrote the end of the last message
    before = engine.prefilled_tokens
    assert turn(engine, "t2", edited, "s") == greedy_reference(model, edited, 6)
    assert engine.prefilled_tokens - before == 5


def test_the_least_recently_used_session_is_evicted_and_re_prefills_correctly(model: torch.nn.Module) -> None:
    engine = ARBatchEngine(model, max_running_requests=1, max_sessions=2)
    histories = {s: [*SYSTEM, *prompt(5, i)] for i, s in enumerate("abc")}
    for s, ids in histories.items():
        histories[s] = [*ids, *turn(engine, f"{s}1", ids, s)]
    assert engine.sessions.sessions == ["b", "c"]  # "a" was evicted when "c" parked
    follow_up = [*histories["a"], *prompt(3, 7)]
    before = engine.prefilled_tokens
    assert turn(engine, "a2", follow_up, "a") == greedy_reference(model, follow_up, 6)
    assert engine.prefilled_tokens - before == len(follow_up)
    assert engine.kv.capacity[0] == 1 + 2  # memory: rows for the running request + kept sessions, no more


def test_a_shared_system_prompt_is_computed_once_for_every_session(model: torch.nn.Module) -> None:
    engine = ARBatchEngine(model, max_running_requests=4, max_sessions=8)
    prompts = {f"s{i}": [*SYSTEM, *prompt(4 + i, 10 + i)] for i in range(4)}
    first = turn(engine, "s0", prompts["s0"], "s0", shared=len(SYSTEM))
    assert engine.reused_tokens == 0
    for s in ("s1", "s2", "s3"):
        engine.add(GenerationRequest(s, prompts[s], 6, session_id=s, shared_prefix_len=len(SYSTEM)))
    outputs = run_to_end(engine)
    assert engine.reused_tokens == 3 * len(SYSTEM)
    assert first == greedy_reference(model, prompts["s0"], 6)
    for s in ("s1", "s2", "s3"):
        assert outputs[s] == greedy_reference(model, prompts[s], 6)


def test_a_seeded_sampled_request_draws_the_same_tokens_whatever_shares_its_batch(model: torch.nn.Module) -> None:
    def sampled(neighbours: int) -> list[int]:
        engine = ARBatchEngine(model, max_running_requests=4)
        engine.add(GenerationRequest("x", prompt(6, 1), 8, temperature=0.9, top_p=0.8, seed=42))
        for i in range(neighbours):
            engine.add(GenerationRequest(f"n{i}", prompt(5, i), 8, temperature=1.0))
        return run_to_end(engine)["x"]

    assert sampled(0) == sampled(3)
