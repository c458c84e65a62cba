"""What the torch AR engine does with OpenAI's request knobs: penalties and biases, as OpenAI defines them.

Every outcome here is fixed by construction or checked against a plain loop on the same weights (a
small random model), never against one machine's model text. (The served responder is llama.cpp's;
its knobs are in ``test_llm_llamacpp.py``, their refusals in ``test_llm_responder.py``.)"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch

from schedulers.ar.engine import ARBatchEngine, GenerationRequest
from schedulers.ar.model import TinyLlama, build_model
from tests.test_ar_engine import CONFIG, prompt, run_to_end

torch.set_num_threads(1)

PROMPT = prompt(8, 3)
FORCED = 77  # a token a +100 logit_bias makes the only choice, whatever the random weights say
N = 64  # 2.0 × 64 outweighs the +100 bias and the tiny model's own logits


@pytest.fixture(scope="module")
def model() -> TinyLlama:
    return build_model(CONFIG)


def penalised_reference(
    model: TinyLlama, ids: list[int], n: int, frequency: float = 0.0, presence: float = 0.0, bias: Any = None
) -> list[int]:
    """Greedy answer of a plain full-sequence loop that applies OpenAI's definition itself: each
    token's logit loses ``presence`` if the answer so far holds it and ``frequency`` times the number
    of times it does, and gains its ``bias``."""
    tokens, out = list(ids), []
    with torch.inference_mode():
        for _ in range(n):
            logits = model.forward_full(torch.tensor([tokens]))[0, -1].float().clone()
            for token, count in Counter(out).items():
                logits[token] -= frequency * count + presence
            for token, plus in (bias or {}).items():
                logits[token] += plus
            out.append(int(logits.argmax()))
            tokens.append(out[-1])
    return out


def answers(model: TinyLlama, n: int, **requests: dict[str, Any]) -> dict[str, list[int]]:
    """The greedy answers to ``PROMPT`` of requests decoded in one batch, each with its own knobs."""
    engine = ARBatchEngine(model, max_running_requests=len(requests))
    for rid, knobs in requests.items():
        engine.add(GenerationRequest(rid, PROMPT, n, **knobs))
    return run_to_end(engine)


def test_penalties_and_biases_of_requests_in_one_batch_follow_openais_definition_token_by_token(
    model: TinyLlama,
) -> None:
    pulled = {FORCED: 3.0}  # a bias that makes one token come back, so that the penalties have repeats to act on
    knobs = {
        "frequency": {"frequency_penalty": 1.0, "logit_bias": pulled},
        "presence": {"presence_penalty": 1.5, "logit_bias": pulled},
        "all": {"frequency_penalty": 0.5, "presence_penalty": -0.5, "logit_bias": {**pulled, 5: -100.0}},
        "bias": {"logit_bias": pulled},
    }
    ours = answers(model, 24, **knobs)
    for rid, given in knobs.items():
        expected = penalised_reference(
            model,
            PROMPT,
            24,
            frequency=given.get("frequency_penalty", 0.0),
            presence=given.get("presence_penalty", 0.0),
            bias=given.get("logit_bias"),
        )
        assert ours[rid] == expected, rid


def test_a_frequency_penalty_overturns_a_token_that_logit_bias_forced(model: TinyLlama) -> None:
    forced = {"logit_bias": {FORCED: 100.0}}
    ours = answers(model, N, plain=forced, penalised={**forced, "frequency_penalty": 2.0})
    assert ours["plain"] == [FORCED] * N  # without a penalty the bias holds for ever: a loop
    run = next(i for i, token in enumerate(ours["penalised"]) if token != FORCED)
    assert 25 <= run < N  # each repeat costs 2.0: the +100 holds for about 50 tokens, then gives way
    assert ours["penalised"] == penalised_reference(model, PROMPT, N, frequency=2.0, bias={FORCED: 100.0})


def test_a_presence_penalty_is_paid_once_however_often_the_token_repeats(model: TinyLlama) -> None:
    forced = {"logit_bias": {FORCED: 100.0}}
    ours = answers(model, N, presence={**forced, "presence_penalty": 2.0})
    assert ours["presence"] == [FORCED] * N


def test_a_logit_bias_of_minus_100_bans_the_greedy_first_token(model: TinyLlama) -> None:
    first = penalised_reference(model, PROMPT, 1)[0]
    ours = answers(model, 3, plain={}, banned={"logit_bias": {first: -100.0}})
    assert ours["plain"][0] == first and ours["banned"][0] != first
