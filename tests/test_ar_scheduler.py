"""ARScheduler behaves as a stage scheduler: batching, streaming, abort, overload."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

import pytest
import torch

from omnitrio.contract import IncomingMessage, OmniRequest, StageOverloaded, StagePayload
from schedulers.ar.engine import ARBatchEngine
from schedulers.ar.model import ModelConfig, build_model
from schedulers.ar.reference import greedy_reference
from schedulers.ar.scheduler import ARScheduler, create_tiny_ar_scheduler
from schedulers.ar.tokenizer import load_tokenizer
from tests.scheduler_harness import outputs_until_done, schedulers_running

torch.set_num_threads(1)

CONFIG = ModelConfig(vocab_size=512, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=256, max_seq_len=256)
MODEL = build_model(CONFIG)


def make_scheduler(**engine_args: int) -> ARScheduler:
    return ARScheduler(ARBatchEngine(MODEL, **engine_args), tokenizer=None)


def new_request(rid: str, data: object, **params: object) -> IncomingMessage:
    return IncomingMessage(rid, "new_request", StagePayload(rid, OmniRequest(data, params=dict(params)), data))


@pytest.fixture
def serve() -> Iterator[Callable[[ARScheduler], ARScheduler]]:
    """Start a scheduler in a thread; stop and join it at the end of the test."""
    with schedulers_running() as start:
        yield start


def test_results_carry_the_greedy_continuation_of_token_prompts(serve) -> None:
    scheduler = serve(make_scheduler())
    prompts = {"short": [5, 6], "long": list(range(1, 30))}
    for rid, ids in prompts.items():
        scheduler.inbox.put(new_request(rid, {"prompt_token_ids": ids}, max_new_tokens=6))
    results = {o.request_id: o.data.data for o in outputs_until_done(scheduler, set(prompts)) if o.type == "result"}
    for rid, ids in prompts.items():
        assert results[rid]["output_token_ids"] == greedy_reference(MODEL, ids, 6)
        assert results[rid]["prompt_token_ids"] == ids
        assert results[rid]["finish_reason"] == "length"


def test_sixteen_concurrent_requests_decode_in_one_batch(serve) -> None:
    scheduler = make_scheduler(max_running_requests=16)
    rids = {f"r{i}" for i in range(16)}
    for i, rid in enumerate(sorted(rids)):
        scheduler.inbox.put(new_request(rid, [i + 1, i + 2, i + 3], max_new_tokens=4))
    serve(scheduler)
    outputs_until_done(scheduler, rids)
    assert max(scheduler.batch_sizes) == 16


def test_streamed_token_ids_add_up_to_the_result(serve) -> None:
    scheduler = serve(make_scheduler())
    scheduler.inbox.put(new_request("s", [3, 1, 4, 1, 5], max_new_tokens=7, stream=True))
    outputs = outputs_until_done(scheduler, {"s"})
    streamed = [t for o in outputs if o.type == "stream" for t in o.data["token_ids"]]
    assert all(o.metadata == {"modality": "tokens"} for o in outputs if o.type == "stream")
    assert outputs[-1].type == "result"
    assert streamed == outputs[-1].data.data["output_token_ids"]


def test_requests_that_do_not_ask_to_stream_get_only_a_result(serve) -> None:
    scheduler = serve(make_scheduler())
    scheduler.inbox.put(new_request("quiet", [3, 1, 4], max_new_tokens=5))
    assert [o.type for o in outputs_until_done(scheduler, {"quiet"})] == ["result"]


def test_abort_mid_decode_frees_the_slot_for_the_waiting_request(serve) -> None:
    scheduler = make_scheduler(max_running_requests=1)
    scheduler.inbox.put(new_request("long", [1, 2, 3], max_new_tokens=200, stream=True))
    scheduler.inbox.put(new_request("next", [4, 5, 6], max_new_tokens=3))
    serve(scheduler)
    first = scheduler.outbox.get(timeout=10)
    assert (first.request_id, first.type) == ("long", "stream")
    scheduler.abort("long")
    outputs = outputs_until_done(scheduler, {"next"})
    assert outputs[-1].type == "result"
    assert not [o for o in outputs if o.request_id == "long" and o.type != "stream"]
    assert len([o for o in outputs if o.request_id == "long"]) < 199


def test_full_waiting_queue_answers_with_stage_overloaded(serve) -> None:
    scheduler = make_scheduler(max_running_requests=1, max_waiting_requests=1)
    for rid in ("a", "b", "c"):
        scheduler.inbox.put(new_request(rid, [1, 2], max_new_tokens=2))
    serve(scheduler)
    outputs = {o.request_id: o for o in outputs_until_done(scheduler, {"a", "b", "c"})}
    assert outputs["c"].type == "error"
    assert isinstance(outputs["c"].data, StageOverloaded)
    assert (outputs["a"].type, outputs["b"].type) == ("result", "result")


def test_bad_prompt_fails_only_its_request_with_a_clear_error(serve) -> None:
    scheduler = serve(make_scheduler())
    scheduler.inbox.put(new_request("bad", {"prompt_token_ids": []}))
    scheduler.inbox.put(new_request("text", "needs a tokenizer"))
    scheduler.inbox.put(new_request("good", [1], max_new_tokens=1))
    outputs = {o.request_id: o for o in outputs_until_done(scheduler, {"bad", "text", "good"})}
    assert "prompt is empty" in str(outputs["bad"].data)
    assert "needs a tokenizer" in str(outputs["text"].data)
    assert outputs["good"].type == "result"


def test_text_prompts_at_the_entry_stage_are_tokenized_and_detokenized(serve) -> None:
    scheduler = serve(create_tiny_ar_scheduler(dim=64, n_layers=1, n_heads=4, n_kv_heads=1))
    data = {"raw_inputs": "Hello there"}
    scheduler.inbox.put(IncomingMessage("t", "new_request", StagePayload("t", OmniRequest("Hello there"), data)))
    (result,) = outputs_until_done(scheduler, {"t"})
    tokenizer = load_tokenizer()
    assert result.data.data["prompt_token_ids"] == tokenizer.encode("Hello there")
    assert result.data.data["text"] == tokenizer.decode(result.data.data["output_token_ids"])


def test_stop_returns_from_start_while_requests_are_running() -> None:
    scheduler = make_scheduler()
    scheduler.inbox.put(new_request("endless", [1], max_new_tokens=250))
    thread = threading.Thread(target=scheduler.start)
    thread.start()
    scheduler.stop()
    thread.join(timeout=10)
    assert not thread.is_alive()
    with pytest.raises(queue.Empty):
        while scheduler.outbox.get_nowait().type != "result":
            pass
