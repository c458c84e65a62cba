"""The Qwen3-Omni talker stage: codes equal to transformers' ``generate``, streamed as the thinker speaks.

The stage is driven through its inbox and outbox (tests/scheduler_harness.py) with the thinker's stream
as ``generate`` itself produced it (toys/qwen3_omni_talker_feed.py), on a tiny random checkpoint the
module writes; every comparison is against ``generate`` on the same weights.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from omnitrio.contract import IncomingMessage, InvalidRequest, OutgoingMessage
from schedulers.engine.handoffs import ThinkerResult
from schedulers.qwen3_omni.handoffs import Codes, TalkerResult
from schedulers.qwen3_omni.talker.codec_sampling import TalkerSampling
from schedulers.qwen3_omni.talker.model import TalkerModel
from schedulers.qwen3_omni.talker.stage import TalkerScheduler, create_talker_stage
from schedulers.qwen3_omni.tiny import write_checkpoint
from tests.scheduler_harness import chunk, done, new, running
from toys.qwen3_omni_reference import load_reference_model, processor_inputs, reference_processor, sample_messages
from toys.qwen3_omni_talker_feed import Reference, reference_run

TIMEOUT = 60.0
THINKER_TOKENS = 10
TALKER_TOKENS = 24
GREEDY = TalkerSampling(do_sample=False, max_new_tokens=TALKER_TOKENS, min_new_tokens=2)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("qwen3-omni-tiny"), size="tiny")


@pytest.fixture(scope="module")
def full(checkpoint: Path) -> tuple[Any, Any]:
    return load_reference_model(checkpoint), reference_processor(checkpoint)


@pytest.fixture(scope="module")
def talker(checkpoint: Path) -> TalkerModel:
    return TalkerModel.from_checkpoint(checkpoint)


def text_messages(words: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are a voice."}, {"role": "user", "content": words}]


PROMPTS: dict[str, Any] = {
    **{name: (lambda name=name: sample_messages()[name]) for name in ("text", "tone", "image")},
    **{f"words{n}": (lambda n=n: text_messages(" ".join(["word"] * n))) for n in range(1, 5)},
}


@pytest.fixture(scope="module")
def reference(full: tuple[Any, Any]) -> Callable[..., Reference]:
    """``generate``'s run for a prompt of :data:`PROMPTS` and a speaker (each computed once per module);
    each call returns a fresh chunk list, so a test may replace chunks in it."""
    model, processor = full
    runs: dict[tuple[str, str], Reference] = {}

    def run(prompt: str, speaker: str = "ethan") -> Reference:
        if (prompt, speaker) not in runs:
            runs[prompt, speaker] = reference_run(
                model,
                dict(processor_inputs(processor, PROMPTS[prompt]())),
                speaker=speaker,
                thinker_max_new_tokens=THINKER_TOKENS,
                talker_max_new_tokens=TALKER_TOKENS,
                eos_token_id=processor.tokenizer.convert_tokens_to_ids("<|im_end|>"),
            )
        ref = runs[prompt, speaker]
        return attrs.evolve(ref, chunks=list(ref.chunks))

    return run


def feed(scheduler: TalkerScheduler, rid: str, ref: Reference, *, first: int = 0, last: int | None = None) -> None:
    """Chunks ``first..last`` of ``ref``'s thinker stream; with ``last`` None also the end and the payload."""
    end = len(ref.chunks) if last is None else last
    for index in range(first, end):
        scheduler.inbox.put(chunk(rid, index, ref.chunks[index]))
    if last is None:
        scheduler.inbox.put(done(rid))
        scheduler.inbox.put(new(rid, ThinkerResult(tuple(ref.token_ids), 0, "stop", want_audio=True)))


def collect(outbox: queue.Queue[OutgoingMessage], rids: set[str]) -> dict[str, tuple[torch.Tensor, OutgoingMessage]]:
    """Every request's codes, joined in order, and its final message."""
    codes: dict[str, list[torch.Tensor]] = {rid: [] for rid in rids}
    final: dict[str, OutgoingMessage] = {}
    while len(final) < len(rids):
        out = outbox.get(timeout=TIMEOUT)
        assert out.request_id in rids and out.request_id not in final, out
        if out.type == "stream":
            assert out.metadata == {"modality": "codes"} and isinstance(out.data, Codes)
            codes[out.request_id].append(out.data.codes)
        else:
            final[out.request_id] = out
    return {rid: (torch.cat(codes[rid], dim=1) if codes[rid] else torch.empty(0), final[rid]) for rid in rids}


def spoken(scheduler: TalkerScheduler, ref: Reference, rid: str = "r") -> torch.Tensor:
    with running(scheduler):
        feed(scheduler, rid, ref)
        codes, final = collect(scheduler.outbox, {rid})[rid]
    assert final.type == "result", final.data
    assert final.data.data == TalkerResult(codes.shape[1])
    return codes


@pytest.mark.parametrize("prompt", ["text", "tone", "image"])
def test_greedy_codes_equal_generate(reference: Callable[..., Reference], talker: TalkerModel, prompt: str) -> None:
    ref = reference(prompt)
    assert ref.codes.shape[1] > 1
    assert torch.equal(spoken(TalkerScheduler(talker, sampling=GREEDY), ref), ref.codes)


def test_talker_speaks_before_the_thinker_ends(reference: Callable[..., Reference], talker: TalkerModel) -> None:
    ref = reference("text")
    assert len(ref.token_ids) > 3
    scheduler = TalkerScheduler(talker, sampling=GREEDY)
    with running(scheduler):
        feed(scheduler, "r", ref, last=3)  # the prompt and two answer tokens: the first one was forwarded
        first = scheduler.outbox.get(timeout=TIMEOUT)
        assert first.type == "stream"
        feed(scheduler, "r", ref, first=3)
        codes, final = collect(scheduler.outbox, {"r"})["r"]
    assert final.type == "result"
    assert torch.equal(torch.cat((first.data.codes, codes), dim=1), ref.codes)


def test_eight_concurrent_requests_each_equal_their_solo_codes(
    reference: Callable[..., Reference], talker: TalkerModel
) -> None:
    refs = {f"r{n}{speaker}": reference(f"words{n}", speaker) for n in range(1, 5) for speaker in ("ethan", "chelsie")}
    scheduler = TalkerScheduler(talker, sampling=GREEDY)
    with running(scheduler):
        longest = max(len(ref.chunks) for ref in refs.values())
        for index in range(longest):  # interleaved as the thinker streams them, one token per request at a time
            for rid, ref in refs.items():
                if index < len(ref.chunks):
                    feed(scheduler, rid, ref, first=index, last=index + 1)
        for rid, ref in refs.items():
            feed(scheduler, rid, ref, first=len(ref.chunks))
        outputs = collect(scheduler.outbox, set(refs))
    for rid, ref in refs.items():
        assert torch.equal(outputs[rid][0], ref.codes), rid
    assert max(scheduler.batch_sizes) > 1


def test_abort_frees_the_request_state(reference: Callable[..., Reference], talker: TalkerModel) -> None:
    ref = reference("text")
    scheduler = TalkerScheduler(talker, sampling=GREEDY)
    with running(scheduler):
        feed(scheduler, "gone", ref, last=3)
        assert scheduler.outbox.get(timeout=TIMEOUT).type == "stream"
        scheduler.abort("gone")
        feed(scheduler, "gone", ref, first=3, last=len(ref.chunks))  # on their way when it was aborted: dropped
        scheduler.inbox.put(done("gone"))
        scheduler.inbox.put(IncomingMessage("gone", "abort"))
        feed(scheduler, "next", ref)
        outputs = collect(scheduler.outbox, {"next"})
        assert torch.equal(outputs["next"][0], ref.codes)
        assert scheduler.active_requests == 0
        assert len(scheduler.kv) == 0


def test_two_speakers_give_different_codes(reference: Callable[..., Reference], talker: TalkerModel) -> None:
    ethan, chelsie = reference("text", "ethan"), reference("text", "chelsie")
    assert torch.equal(spoken(TalkerScheduler(talker, sampling=GREEDY), ethan), ethan.codes)
    assert torch.equal(spoken(TalkerScheduler(talker, sampling=GREEDY), chelsie), chelsie.codes)
    assert not torch.equal(ethan.codes, chelsie.codes)


def test_unknown_voice_is_a_client_error_naming_the_speakers(
    reference: Callable[..., Reference], talker: TalkerModel
) -> None:
    ref = reference("text")
    ref.chunks[0] = attrs.evolve(ref.chunks[0], speaker="nobody")
    scheduler = TalkerScheduler(talker, sampling=GREEDY)
    with running(scheduler):
        feed(scheduler, "r", ref)
        out = scheduler.outbox.get(timeout=TIMEOUT)
    assert out.type == "error" and isinstance(out.data, InvalidRequest)
    assert "ethan" in str(out.data) and out.data.param == "audio.voice"


def test_a_request_waiting_for_text_does_not_hold_back_others(
    reference: Callable[..., Reference], talker: TalkerModel
) -> None:
    slow, fast = reference("text"), reference("image")
    scheduler = TalkerScheduler(talker, sampling=GREEDY)
    with running(scheduler):
        feed(scheduler, "slow", slow, last=3)  # its thinker stalls after two answer tokens
        feed(scheduler, "fast", fast)
        fast_codes, slow_codes = [], []
        while (out := scheduler.outbox.get(timeout=TIMEOUT)).type == "stream":
            (fast_codes if out.request_id == "fast" else slow_codes).append(out.data.codes)
        assert out.request_id == "fast" and out.type == "result"  # done while slow still waits for its text
        feed(scheduler, "slow", slow, first=3)
        codes, final = collect(scheduler.outbox, {"slow"})["slow"]
    assert torch.equal(torch.cat(fast_codes, dim=1), fast.codes)
    assert final.type == "result"
    assert torch.equal(torch.cat([*slow_codes, codes], dim=1), slow.codes)


def test_frames_go_out_in_chunks_of_the_configured_size(
    reference: Callable[..., Reference], talker: TalkerModel
) -> None:
    ref = reference("tone")
    scheduler = TalkerScheduler(talker, sampling=GREEDY, frames_per_chunk=4)
    with running(scheduler):
        feed(scheduler, "r", ref)
        messages = []
        while (out := scheduler.outbox.get(timeout=TIMEOUT)).type == "stream":
            messages.append(out.data.codes)
    sizes = [codes.shape[1] for codes in messages]
    assert sizes[:-1] == [4] * (len(sizes) - 1) and 1 <= sizes[-1] <= 4
    assert torch.equal(torch.cat(messages, dim=1), ref.codes)


def test_sampled_codes_are_generates_draws_for_the_seed(
    full: tuple[Any, Any], reference: Callable[..., Reference], talker: TalkerModel
) -> None:
    """Sampling with ``generate``'s talker defaults draws, first code then the code predictor's, in
    ``generate``'s order from the scheduler's generator: seeded alike, the codes are ``generate``'s sampled
    ones — not the greedy ones — and the same again for the seed."""
    model, processor = full
    inputs = dict(processor_inputs(processor, PROMPTS["text"]()))
    eos = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    torch.manual_seed(7)
    drawn = reference_run(
        model,
        inputs,
        speaker="ethan",
        thinker_max_new_tokens=THINKER_TOKENS,
        talker_max_new_tokens=TALKER_TOKENS,
        eos_token_id=eos,
        talker_do_sample=True,
    )
    sampling = TalkerSampling(max_new_tokens=TALKER_TOKENS, min_new_tokens=2)  # generate's sampling defaults
    first, second = (spoken(TalkerScheduler(talker, sampling=sampling, seed=7), drawn) for _ in range(2))
    greedy = reference("text").codes
    assert torch.equal(first, drawn.codes) and torch.equal(second, first)
    assert first.shape != greedy.shape or not torch.equal(first, greedy)
    assert int(first.max()) < talker.config.code2wav_config.codebook_size


def test_a_text_only_request_without_a_stream_gives_no_codes(talker: TalkerModel) -> None:
    scheduler = TalkerScheduler(talker, sampling=GREEDY)
    with running(scheduler):
        scheduler.inbox.put(done("text-only"))
        scheduler.inbox.put(new("text-only", ThinkerResult((5,), 3, "stop", want_audio=False)))
        scheduler.inbox.put(done("lost"))
        scheduler.inbox.put(new("lost", ThinkerResult((5,), 3, "stop", want_audio=True)))
        outputs = {out.request_id: out for out in (scheduler.outbox.get(timeout=TIMEOUT) for _ in range(2))}
    assert outputs["text-only"].type == "result" and outputs["text-only"].data.data == TalkerResult(0)
    assert outputs["lost"].type == "error" and "without its TalkerPrompt" in str(outputs["lost"].data)


@pytest.mark.parametrize("options", [{"top_p": 0.0}, {"temperature": "warm"}, {"beams": 2}])
def test_bad_talker_options_are_a_client_error(
    reference: Callable[..., Reference], talker: TalkerModel, options: dict[str, Any]
) -> None:
    ref = reference("text")
    ref.chunks[0] = attrs.evolve(ref.chunks[0], talker=options)
    scheduler = TalkerScheduler(talker, sampling=GREEDY)
    with running(scheduler):
        feed(scheduler, "r", ref)
        out = scheduler.outbox.get(timeout=TIMEOUT)
    assert out.type == "error" and isinstance(out.data, InvalidRequest) and out.data.param == "talker"


def test_the_factory_serves_the_checkpoint_dir_greedy(reference: Callable[..., Reference], checkpoint: Path) -> None:
    ref = reference("image")
    scheduler = create_talker_stage(
        model_dir=str(checkpoint), do_sample=False, max_new_tokens=TALKER_TOKENS, min_new_tokens=2
    )
    assert torch.equal(spoken(scheduler, ref), ref.codes)


def test_a_thinker_answer_of_one_token_gives_no_codes(reference: Callable[..., Reference], talker: TalkerModel) -> None:
    ref = reference("text")
    scheduler = TalkerScheduler(talker, sampling=GREEDY)
    with running(scheduler):  # the one token (its eos) is never forwarded: there is no text to speak
        feed(scheduler, "r", attrs.evolve(ref, chunks=ref.chunks[:2]))
        out = scheduler.outbox.get(timeout=TIMEOUT)
    assert out.type == "result" and out.data.data == TalkerResult(0)
