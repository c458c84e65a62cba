"""The Qwen2.5-Omni talker stage: ``generate``'s codes, batched across requests, fed by the thinker's stream.

The stage is driven through its inbox and outbox (tests/scheduler_harness.py) with the thinker's stream as
``generate`` computed it (its hidden states and input embeddings, :func:`tests.qwen2_5_omni_reference.
reference_answer`), on the tiny checkpoint; its codes go on to the token2wav stage as the runtime hands them
on.  Every comparison is against ``generate`` on the same weights.
"""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnitrio.contract import IncomingMessage, InvalidRequest, OmniRequest, OutgoingMessage, StagePayload, StreamItem
from schedulers.engine.handoffs import ThinkerResult
from schedulers.qwen2_5_omni.handoffs import TalkerCodes, TalkerDone, TalkerPrompt, TalkerToken, Voice
from schedulers.qwen2_5_omni.talker.codec_sampling import CodecSampling
from schedulers.qwen2_5_omni.talker.model import TalkerModel
from schedulers.qwen2_5_omni.talker.stage import TalkerScheduler, create_talker_stage
from schedulers.qwen2_5_omni.token2wav.stage import create_token2wav_stage
from tests import qwen2_5_omni_reference as ref
from tests.qwen2_5_omni_reference import reference_model, talker_model, tiny_checkpoint  # noqa: F401  (fixtures)
from tests.scheduler_harness import chunk, done, new, put_atomically, running

WAIT = 120.0
GREEDY = CodecSampling(do_sample=False)
MIN_WHOLE_SNR_DB = 60.0

PROMPTS = ref.TALKER_PROMPTS


@pytest.fixture(scope="module")
def reference(model: Any, tiny: Path) -> Any:
    """``generate``'s answer for a prompt of :data:`PROMPTS` and a speaker, with the prompt's ids (each once)."""
    processor = ref.reference_processor(tiny)
    runs: dict[tuple[str, str], tuple[torch.Tensor, ref.Answer]] = {}

    def run(prompt: str, speaker: str = "Chelsie") -> tuple[torch.Tensor, ref.Answer]:
        if (prompt, speaker) not in runs:
            tokens = 40 if prompt == "ends by eos" else 10
            answer = ref.reference_answer(model, processor, PROMPTS[prompt], speaker=speaker, max_new_tokens=tokens)
            runs[prompt, speaker] = ref.reference_inputs(processor, PROMPTS[prompt])["input_ids"][0], answer
        return runs[prompt, speaker]

    return run


def thinker_stream(rid: str, ids: torch.Tensor, answer: ref.Answer, voice: Voice) -> list[IncomingMessage]:
    """What the thinker sends the talker: its prompt chunk, one chunk per forwarded token, its end, its result."""
    prompt = TalkerPrompt(ids, answer.hidden[0][0], answer.embeds[0][0], voice)
    tokens = [TalkerToken(h[0, -1], e[0, -1]) for h, e in zip(answer.hidden[1:], answer.embeds[1:], strict=True)]
    result = ThinkerResult(tuple(answer.ids), ids.shape[0], "stop", want_audio=True)
    chunks = [chunk(rid, index, data) for index, data in enumerate([prompt, *tokens])]
    return [*chunks, done(rid), new(rid, result)]


def collect(outbox: queue.Queue[OutgoingMessage], rids: set[str]) -> dict[str, tuple[list[int], OutgoingMessage]]:
    """Every request's codes, joined in order, and its final message."""
    codes: dict[str, list[int]] = {rid: [] for rid in rids}
    final: dict[str, OutgoingMessage] = {}
    while len(final) < len(rids):
        out = outbox.get(timeout=WAIT)
        assert out.request_id in rids and out.request_id not in final, out
        if out.type == "stream":
            assert out.metadata == {"modality": "codes"} and isinstance(out.data, TalkerCodes)
            assert out.data.voice is not None
            codes[out.request_id].extend(out.data.codes.tolist())
        else:
            final[out.request_id] = out
    return {rid: (codes[rid], final[rid]) for rid in rids}


def spoken(scheduler: TalkerScheduler, rid: str, ids: torch.Tensor, answer: ref.Answer, voice: Voice) -> list[int]:
    with running(scheduler):
        put_atomically(scheduler.inbox, thinker_stream(rid, ids, answer, voice))
        codes, final = collect(scheduler.outbox, {rid})[rid]
    assert final.type == "result", final.data
    assert final.data.data == TalkerDone(len(codes), voice)
    return codes


@pytest.mark.parametrize("prompt", ["text", "audio", "image", "ends by eos"])
def test_greedy_codes_equal_generate(reference: Any, talker: TalkerModel, prompt: str) -> None:
    ids, answer = reference(prompt)
    assert len(answer.codes) > 1
    voice = Voice("chelsie", 0, stream=False)  # any case
    assert spoken(TalkerScheduler(talker, sampling=GREEDY), "r", ids, answer, voice) == answer.codes


def test_min_new_tokens_holds_the_end_codes_back_as_generate_does(
    reference: Any, talker: TalkerModel, model: Any, tiny: Path
) -> None:
    ids, answer = reference("text")
    held = len(answer.codes) + 6
    longer = ref.reference_answer(
        model, ref.reference_processor(tiny), PROMPTS["text"], max_new_tokens=10, talker_min_new_tokens=held
    )
    assert len(longer.codes) >= held > len(answer.codes)
    scheduler = TalkerScheduler(talker, sampling=CodecSampling(do_sample=False, min_new_tokens=held))
    assert spoken(scheduler, "r", ids, longer, Voice("Chelsie", 0, stream=False)) == longer.codes


def test_eight_requests_stepped_together_equal_their_solo_codes(reference: Any, talker: TalkerModel) -> None:
    runs = {
        f"{prompt}-{speaker}": (*reference(prompt, speaker), speaker)
        for prompt in PROMPTS
        for speaker in ("Chelsie", "Ethan")
    }
    assert len({tuple(answer.codes) for _, answer, _ in runs.values()}) >= 4  # not one answer eight times
    scheduler = TalkerScheduler(talker, sampling=GREEDY)
    for rid, (ids, answer, speaker) in runs.items():  # queued before the loop starts: its first turn sees all
        put_atomically(scheduler.inbox, thinker_stream(rid, ids, answer, Voice(speaker, 0)))
    with running(scheduler):
        outputs = collect(scheduler.outbox, set(runs))
    for rid, (_, answer, _) in runs.items():
        assert outputs[rid][0] == answer.codes, rid
    assert max(scheduler.batch_sizes) >= 2


def test_a_request_whose_text_trickles_in_speaks_the_same_codes(reference: Any, talker: TalkerModel) -> None:
    ids, answer = reference("text")
    messages = thinker_stream("slow", ids, answer, Voice("Chelsie", 0))
    scheduler = TalkerScheduler(talker, sampling=GREEDY)
    codes: list[int] = []
    with running(scheduler):
        put_atomically(scheduler.inbox, messages[:2])  # the prompt and answer token 0: the prefill's rows
        for message in messages[2:]:
            out = scheduler.outbox.get(timeout=WAIT)  # the talker spoke all its text allows, then waits
            assert out.type == "stream" and len(out.data.codes) == 1
            codes.extend(out.data.codes.tolist())
            assert scheduler.outbox.empty()
            scheduler.inbox.put(message)
        rest, final = collect(scheduler.outbox, {"slow"})["slow"]
    assert final.type == "result"
    assert codes + rest == answer.codes


def test_abort_mid_stream_frees_the_rows(reference: Any, talker: TalkerModel) -> None:
    ids, answer = reference("text")
    messages = thinker_stream("gone", ids, answer, Voice("Chelsie", 0))
    scheduler = TalkerScheduler(talker, sampling=GREEDY)
    with running(scheduler):
        put_atomically(scheduler.inbox, messages[:3])
        assert scheduler.outbox.get(timeout=WAIT).type == "stream"
        scheduler.abort("gone")
        put_atomically(scheduler.inbox, messages[3:-1])  # on their way when it was aborted: dropped
        scheduler.inbox.put(IncomingMessage("gone", "abort"))  # the runtime's in-order abort ends that life
        put_atomically(scheduler.inbox, thinker_stream("next", ids, answer, Voice("Chelsie", 0)))
        codes: list[int] = []
        while True:
            out = scheduler.outbox.get(timeout=WAIT)
            if out.request_id == "gone":  # chunks stepped before the abort reached the thread; never a result
                assert out.type == "stream", out
            elif out.type == "stream":
                codes.extend(out.data.codes.tolist())
            else:
                assert out.type == "result", out
                break
        assert codes == answer.codes
        assert scheduler.active_requests == 0
        assert len(scheduler.kv) == 0


def test_an_unknown_voice_is_a_client_error_naming_the_speakers(reference: Any, talker: TalkerModel) -> None:
    ids, answer = reference("text")
    scheduler = TalkerScheduler(talker, sampling=GREEDY)
    with running(scheduler):
        put_atomically(scheduler.inbox, thinker_stream("r", ids, answer, Voice("alloy", 0)))
        _, final = collect(scheduler.outbox, {"r"})["r"]
    assert final.type == "error" and isinstance(final.data, InvalidRequest)
    assert "Chelsie" in str(final.data) and "Ethan" in str(final.data)
    assert scheduler.active_requests == 0


def test_a_request_without_audio_gives_no_codes(talker: TalkerModel) -> None:
    scheduler = TalkerScheduler(talker, sampling=GREEDY)
    with running(scheduler):
        scheduler.inbox.put(new("quiet", ThinkerResult((1, 2), 3, "stop", want_audio=False)))
        _, final = collect(scheduler.outbox, {"quiet"})["quiet"]
    assert final.type == "result" and final.data.data == TalkerDone(0, None)


def test_sampled_codes_follow_the_voices_seed(reference: Any, talker: TalkerModel) -> None:
    ids, answer = reference("text")
    scheduler = TalkerScheduler(talker, sampling=CodecSampling(max_new_tokens=12))

    def sampled(seed: int) -> list[int]:
        return spoken(scheduler, f"s{seed}", ids, answer, Voice("Chelsie", seed))

    first, again, other = sampled(0), sampled(0), sampled(1)
    assert first == again and first != other


def test_the_talker_and_token2wav_stages_speak_generates_audio(reference: Any, tiny: Path) -> None:
    ids, answer = reference("text")
    voice = Voice("Chelsie", 0, stream=False)
    talker = create_talker_stage(model_dir=str(tiny), do_sample=False, frames_per_chunk=3)
    token2wav = create_token2wav_stage(model_dir=str(tiny))
    talker.warm_up_serving_thread()
    assert talker.warmed == ["talker forward"]
    with running(talker), running(token2wav):
        put_atomically(talker.inbox, thinker_stream("r", ids, answer, voice))
        chunk_id, ended, pcm = 0, False, []
        while not ended:  # hand the talker's outputs on as the runtime does: chunks, then the result, then done
            out = talker.outbox.get(timeout=WAIT)
            if out.type == "stream":
                token2wav.inbox.put(IncomingMessage("r", "stream_chunk", StreamItem(chunk_id, out.data, "talker")))
                chunk_id += 1
            else:
                assert out.type == "result", out.data
                result = StagePayload("r", OmniRequest(inputs=None), out.data.data)
                put_atomically(token2wav.inbox, [IncomingMessage("r", "new_request", result), done("r")])
                ended = True
        while (msg := token2wav.outbox.get(timeout=WAIT)).type == "stream":
            pcm.append(msg.data["pcm"])
        assert msg.type == "result", msg.data
    audio = np.concatenate(pcm).astype(np.float64)
    expected = answer.wav.reshape(-1).double().numpy()
    assert audio.shape == expected.shape
    snr = 10 * np.log10(np.sum(expected**2) / max(np.sum((expected - audio) ** 2), 1e-30))
    assert snr >= MIN_WHOLE_SNR_DB


def test_the_factory_names_the_knobs_when_one_is_unknown(tiny: Path) -> None:
    with pytest.raises(ValueError, match="top_k"):
        create_talker_stage(model_dir=str(tiny), top_n=3)
