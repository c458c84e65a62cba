"""What the torch AR engine does with OpenAI's request knobs: penalties and biases change SmolLM2's answer.

(The served responder is llama.cpp's; its refusals are in ``test_llm_responder.py``.)"""

from __future__ import annotations

from typing import Any

import pytest

from schedulers.ar.chat_tokenizer import ChatTokenizer
from schedulers.ar.engine import ARBatchEngine, GenerationRequest
from schedulers.ar.gguf_file import GGUFModel
from schedulers.ar.weight_formats import load_model
from tests.test_ar_engine import run_to_end
from tests.test_llm_gguf import chat, source, tokenizer

pytestmark = pytest.mark.timeout(300)  # loads SmolLM2: past the global 120 s when busy

__all__ = ["source", "tokenizer"]  # the module fixtures: SmolLM2 read once, 256-token context
CAT = "What's a good name for a pet cat?"


@pytest.fixture(scope="module")
def engine(source: GGUFModel) -> ARBatchEngine:
    return ARBatchEngine(load_model(source, "int4"), max_running_requests=2)


def answer(engine: ARBatchEngine, tokenizer: ChatTokenizer, text: str, **knobs: Any) -> str:
    engine.add(GenerationRequest("q", chat(tokenizer, text), 60, eos_token_id=tokenizer.eos_token_id, **knobs))
    return tokenizer.decode(run_to_end(engine)["q"])


def repeated_lines(text: str) -> list[str]:
    lines = [line.strip() for line in text.splitlines() if line.strip()][:-1]  # the last may be cut
    return [line for i, line in enumerate(lines) if line in lines[:i]]


def test_frequency_penalty_ends_a_looping_answer(engine: ARBatchEngine, tokenizer: ChatTokenizer) -> None:
    looping = answer(engine, tokenizer, CAT)
    penalised = answer(engine, tokenizer, CAT, frequency_penalty=1.0)
    assert repeated_lines(looping) != []
    assert penalised != looping and repeated_lines(penalised) == []


def test_presence_penalty_changes_the_answer(engine: ARBatchEngine, tokenizer: ChatTokenizer) -> None:
    assert answer(engine, tokenizer, CAT, presence_penalty=2.0) != answer(engine, tokenizer, CAT)


def test_a_logit_bias_bans_the_greedy_first_word(engine: ARBatchEngine, tokenizer: ChatTokenizer) -> None:
    question = "What is the capital of France?"
    first = chat(tokenizer, question)
    plain = answer(engine, tokenizer, question)
    engine.add(GenerationRequest("first", first, 1))
    banned = run_to_end(engine)["first"][0]
    assert not answer(engine, tokenizer, question, logit_bias={banned: -100.0}).startswith(plain.split()[0])
