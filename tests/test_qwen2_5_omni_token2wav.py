"""The token2wav stage driven directly (inbox/outbox) against transformers on a tiny checkpoint.

The reference is ``Qwen2_5OmniForConditionalGeneration.generate(return_audio=True)`` with thinker and talker
greedy after ``torch.manual_seed(seed)``: its audio, and the codes its talker generated on the way.  A request
that does not stream decodes all codes at once and equals that audio; a streamed one follows the release's
scheme (:mod:`schedulers.qwen2_5_omni.token2wav.windows`) and its SNR against it is stated and bounded.
"""

from __future__ import annotations

import itertools
import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnitrio.contract import IncomingMessage, OmniRequest, OutgoingMessage, StagePayload, StreamItem
from schedulers.qwen2_5_omni.checkpoint import speakers
from schedulers.qwen2_5_omni.handoffs import TalkerCodes, TalkerDone, Voice
from schedulers.qwen2_5_omni.token2wav.model import Token2Wav
from schedulers.qwen2_5_omni.token2wav.noise import NoiseStream
from schedulers.qwen2_5_omni.token2wav.stage import Token2WavScheduler, create_token2wav_stage
from schedulers.qwen2_5_omni.token2wav.stream import SpeechStream, decode
from schedulers.qwen2_5_omni.token2wav.windows import Chunk, Schedule
from tests.qwen2_5_omni_reference import (  # noqa: F401  (fixtures model, tiny)
    reference_model,
    talker_codes,
    tiny_checkpoint,
)
from tests.scheduler_harness import TIMEOUT, done, put_atomically, running

WAIT = TIMEOUT * 15  # a decode under load
SAMPLES_PER_CODE = 480
MIN_STREAMED_SNR_DB = 75.0  # measured 83-92 dB on this checkpoint; the release's scheme reaches 46-48 dB
MIN_ROUNDING_SNR_DB = 100.0  # the same windows, other batch shapes: float rounding only


@pytest.fixture(scope="module")
def reference(model: Any) -> Any:
    """transformers' model of the tiny checkpoint (:func:`tests.qwen2_5_omni_reference.reference_model`)."""
    return model


def generate(
    model: Any, tiny: Path, words: str, *, tokens: int, speaker: str = "Chelsie", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' greedy answer to a text prompt: the talker's codes (``Long[n]``) and the audio."""
    from transformers import Qwen2Tokenizer

    tokenizer = Qwen2Tokenizer.from_pretrained(tiny)
    template = json.loads((tiny / "chat_template.json").read_text())["chat_template"]
    messages = [{"role": "user", "content": [{"type": "text", "text": words}]}]
    text = tokenizer.apply_chat_template(messages, chat_template=template, add_generation_prompt=True, tokenize=False)
    inputs = tokenizer(text, return_tensors="pt")
    with talker_codes(model) as codes:
        torch.manual_seed(seed)
        _, wav = model.generate(
            **inputs, speaker=speaker, thinker_max_new_tokens=tokens, thinker_do_sample=False, talker_do_sample=False
        )
    (spoken,) = codes
    ends = torch.isin(spoken, torch.tensor([model.talker.codec_pad_token, model.talker.codec_eos_token]))
    return spoken[: int(ends.nonzero()[0, 0]) if ends.any() else len(spoken)], wav


@pytest.fixture(scope="module")
def answer(reference: Any, tiny: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and audio of a 100-token answer (Chelsie, seed 0): 200 mel frames, 8.3 DiT blocks, 4 chunks."""
    return generate(reference, tiny, "Tell me about the river and the town.", tokens=100)


@pytest.fixture
def scheduler(tiny: Path) -> Iterator[Token2WavScheduler]:
    with running(create_token2wav_stage(model_dir=str(tiny))) as stage:
        yield stage


def chunk(rid: str, chunk_id: int, codes: torch.Tensor, voice: Voice | None = None) -> IncomingMessage:
    return IncomingMessage(rid, "stream_chunk", StreamItem(chunk_id, TalkerCodes(codes, voice), "talker"))


def result(rid: str, num_codes: int) -> IncomingMessage:
    return IncomingMessage(rid, "new_request", StagePayload(rid, OmniRequest(inputs=None), TalkerDone(num_codes)))


def talk(rid: str, codes: torch.Tensor, step: int, voice: Voice) -> list[IncomingMessage]:
    """What the talker sends: chunks of ``step`` codes (the first with the voice), its result, its end."""
    starts = range(0, codes.shape[0], step)
    chunks = [chunk(rid, i, codes[start : start + step], voice if i == 0 else None) for i, start in enumerate(starts)]
    return [*chunks, result(rid, codes.shape[0]), done(rid)]


def collect(outbox: queue.Queue[OutgoingMessage], rids: set[str]) -> dict[str, tuple[list[np.ndarray], Any]]:
    """Every request's audio chunks and its result data (or its error message), until each has ended."""
    streams: dict[str, list[np.ndarray]] = {rid: [] for rid in rids}
    ends: dict[str, Any] = {}
    while len(ends) < len(rids):
        msg = outbox.get(timeout=WAIT)
        if msg.type == "stream":
            assert msg.data["sample_rate"] == 24_000 and msg.data["pcm"].dtype == np.float32
            assert msg.metadata == {"modality": "audio"}
            streams[msg.request_id].append(msg.data["pcm"])
        else:
            ends[msg.request_id] = msg.data.data if msg.type == "result" else msg
    return {rid: (streams[rid], ends[rid]) for rid in rids}


def speak(scheduler: Token2WavScheduler, rid: str, codes: torch.Tensor, voice: Voice, step: int = 7) -> np.ndarray:
    put_atomically(scheduler.inbox, talk(rid, codes, step, voice))
    ((chunks, end),) = collect(scheduler.outbox, {rid}).values()
    audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    assert end == {"num_samples": len(audio), "num_codes": codes.shape[0], "sample_rate": 24_000}
    return audio


def snr_db(reference: np.ndarray | torch.Tensor, audio: np.ndarray | torch.Tensor) -> float:
    ref, got = np.asarray(reference, np.float64), np.asarray(audio, np.float64)
    return float(10 * np.log10(np.sum(ref**2) / max(np.sum((ref - got) ** 2), 1e-30)))


def test_a_request_that_does_not_stream_is_generates_audio(
    scheduler: Token2WavScheduler, answer: tuple[torch.Tensor, torch.Tensor]
) -> None:
    codes, wav = answer
    audio = speak(scheduler, "r", codes, Voice("Chelsie", 0, stream=False))
    assert len(audio) == len(wav) == codes.shape[0] * SAMPLES_PER_CODE
    assert np.array_equal(audio, wav.numpy())  # the same operations in the same order: bit for bit


def test_a_streamed_request_follows_the_release_scheme(
    scheduler: Token2WavScheduler, answer: tuple[torch.Tensor, torch.Tensor]
) -> None:
    codes, wav = answer
    audio = speak(scheduler, "r", codes, Voice("Chelsie", 0))
    assert len(audio) == len(wav)
    assert snr_db(wav, audio) >= MIN_STREAMED_SNR_DB
    assert not np.array_equal(audio, wav.numpy())  # it did stream: the DiT cannot stream exactly


@pytest.mark.parametrize("codes", [1, 11, 12, 13, 36, 60], ids=lambda n: f"{n}-codes")
def test_every_length_speaks_as_long_as_the_whole_decode(scheduler: Token2WavScheduler, tiny: Path, codes: int) -> None:
    spoken = torch.randint(0, 8192, (codes,), generator=torch.Generator().manual_seed(codes))
    whole = speak(scheduler, "whole", spoken, Voice("Ethan", 3, stream=False))
    streamed = speak(scheduler, "streamed", spoken, Voice("Ethan", 3))
    assert len(streamed) == len(whole) == codes * SAMPLES_PER_CODE
    assert snr_db(whole, streamed) >= MIN_STREAMED_SNR_DB


def test_the_seed_and_the_speaker_change_the_audio_as_they_change_generates(
    scheduler: Token2WavScheduler, reference: Any, tiny: Path
) -> None:
    words, tokens = "Hello, how are you?", 30
    for speaker, seed in (("Chelsie", 0), ("Chelsie", 1), ("Ethan", 0)):
        codes, wav = generate(reference, tiny, words, tokens=tokens, speaker=speaker, seed=seed)
        audio = speak(scheduler, f"{speaker}-{seed}", codes, Voice(speaker, seed, stream=False))
        assert np.array_equal(audio, wav.numpy())
    codes, _ = generate(reference, tiny, words, tokens=tokens)
    chelsie = speak(scheduler, "a", codes, Voice("Chelsie", 0, stream=False))
    assert snr_db(chelsie, speak(scheduler, "b", codes, Voice("Chelsie", 1, stream=False))) < 20
    assert snr_db(chelsie, speak(scheduler, "c", codes, Voice("Ethan", 0, stream=False))) < 20
    assert np.array_equal(chelsie, speak(scheduler, "d", codes, Voice("chelsie", 0, stream=False)))  # any case


def test_the_audio_does_not_depend_on_how_the_talker_chunks_its_codes(
    scheduler: Token2WavScheduler, answer: tuple[torch.Tensor, torch.Tensor]
) -> None:
    codes = answer[0][:80]
    one_by_one = speak(scheduler, "a", codes, Voice("Chelsie", 0), step=1)
    all_at_once = speak(scheduler, "b", codes, Voice("Chelsie", 0), step=80)
    assert snr_db(one_by_one, all_at_once) >= MIN_ROUNDING_SNR_DB


def test_concurrent_requests_share_forwards_and_equal_their_solo_audio(
    scheduler: Token2WavScheduler, answer: tuple[torch.Tensor, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    codes = answer[0]
    voices = {"a": Voice("Chelsie", 0), "b": Voice("Ethan", 5), "c": Voice("Chelsie", 9), "d": Voice("Ethan", 0, False)}
    lengths = {"a": 100, "b": 90, "c": 77, "d": 60}
    solo = {rid: speak(scheduler, rid, codes[: lengths[rid]], voice) for rid, voice in voices.items()}
    model = scheduler.model
    batches: list[int] = []
    velocities = model.velocities

    def counted(rows: list[Any]) -> list[torch.Tensor]:
        batches.append(len(rows))
        return velocities(rows)

    monkeypatch.setattr(model, "velocities", counted)
    talks = [talk(rid, codes[: lengths[rid]], 6, voice) for rid, voice in voices.items()]
    put_atomically(scheduler.inbox, [msg for turn in itertools.zip_longest(*talks) for msg in turn if msg])
    for rid, (chunks, end) in collect(scheduler.outbox, set(voices)).items():
        together = np.concatenate(chunks)
        assert end["num_samples"] == len(together) == len(solo[rid])
        assert snr_db(solo[rid], together) >= MIN_ROUNDING_SNR_DB
    assert max(batches) >= 3  # windows of different requests (and speakers) went through one forward


def test_first_audio_leaves_before_the_codes_end(
    scheduler: Token2WavScheduler, answer: tuple[torch.Tensor, torch.Tensor]
) -> None:
    codes = answer[0]
    first_window = 2 * 12  # the first chunk (one block of 24 mel frames = 12 codes) and its block of future
    scheduler.inbox.put(chunk("r", 0, codes[: first_window - 1], Voice("Chelsie", 0)))
    scheduler.inbox.put(chunk("r", 1, codes[first_window - 1 : first_window]))
    first = scheduler.outbox.get(timeout=WAIT)
    assert first.type == "stream" and len(first.data["pcm"]) == 12 * 240  # the block but its held-back half
    put_atomically(scheduler.inbox, [chunk("r", 2, codes[first_window:]), result("r", codes.shape[0]), done("r")])
    ((chunks, end),) = collect(scheduler.outbox, {"r"}).values()
    assert end["num_samples"] == len(first.data["pcm"]) + sum(map(len, chunks)) == codes.shape[0] * SAMPLES_PER_CODE


def test_abort_mid_audio_frees_the_request_and_drops_its_late_chunks(
    scheduler: Token2WavScheduler, answer: tuple[torch.Tensor, torch.Tensor]
) -> None:
    codes = answer[0]
    chunks = talk("r", codes, 24, Voice("Chelsie", 0))
    put_atomically(scheduler.inbox, chunks[:2])
    assert scheduler.outbox.get(timeout=WAIT).type == "stream"
    scheduler.abort("r")
    speak(scheduler, "sync", codes[:3], Voice("Ethan", 0))  # the inbox is in order: the abort came first
    assert scheduler.active_streams == 0
    put_atomically(scheduler.inbox, chunks[2:4])  # late chunks of the aborted request
    speak(scheduler, "sync-2", codes[:3], Voice("Ethan", 0))
    assert scheduler.active_streams == 0 and scheduler.outbox.empty()


def test_bad_input_fails_only_its_request(
    scheduler: Token2WavScheduler, answer: tuple[torch.Tensor, torch.Tensor]
) -> None:
    codes = answer[0][:20]
    put_atomically(
        scheduler.inbox,
        [
            chunk("wide", 0, codes.unsqueeze(0), Voice("Chelsie", 0)),
            chunk("nobody", 0, codes, Voice("Alloy", 0)),
            chunk("voiceless", 0, codes),
            chunk("miscounted", 0, codes, Voice("Chelsie", 0)),
            result("miscounted", 21),
            done("miscounted"),
            *talk("good", codes, 5, Voice("Ethan", 1)),
        ],
    )
    outcomes = collect(scheduler.outbox, {"wide", "nobody", "voiceless", "miscounted", "good"})
    assert "must be a tensor Long[n >= 1]" in str(outcomes["wide"][1].data)
    assert "unknown speaker 'Alloy'; this checkpoint has Chelsie, Ethan" in str(outcomes["nobody"][1].data)
    assert "the first chunk of 'voiceless' carries no voice" in str(outcomes["voiceless"][1].data)
    assert "num_codes=21, but 20 codes arrived" in str(outcomes["miscounted"][1].data)
    assert outcomes["good"][1]["num_samples"] == 20 * SAMPLES_PER_CODE
    assert scheduler.active_streams == 0


def test_no_codes_is_no_audio(scheduler: Token2WavScheduler) -> None:
    put_atomically(scheduler.inbox, [result("r", 0), done("r")])
    ((chunks, end),) = collect(scheduler.outbox, {"r"}).values()
    assert chunks == [] and end["num_samples"] == 0
    assert scheduler.active_streams == 0


def test_the_noise_drawn_frame_by_frame_is_the_whole_draw() -> None:
    torch.manual_seed(11)
    whole = torch.randn([1, 90, 32])
    noise = NoiseStream(11, 32)
    torch.randn(7)  # the global generator moving does not move the request's
    parts = [noise.frames(0, 5), noise.frames(5, 48)]
    noise.release(40)
    parts.append(noise.frames(48, 90))
    assert torch.equal(torch.cat(parts), whole[0])
    assert torch.equal(noise.frames(40, 50), whole[0, 40:50])
    with pytest.raises(ValueError, match="released"):
        noise.frames(39, 41)


def test_chunks_grow_and_cover_the_sequence_on_block_boundaries() -> None:
    schedule = Schedule(block_size=24, repeats=2)  # 1, 2, 4, then 8 blocks; 2 blocks past, 1 future
    total = 500
    chunks = [chunk for i in range(9) if (chunk := schedule.chunk(i, total, total)) is not None]
    assert [(c.start, c.end) for c in chunks] == [(0, 24), (24, 72), (72, 168), (168, 360), (360, 500)]
    assert [(c.window_start, c.window_end) for c in chunks] == [(0, 48), (0, 96), (24, 192), (120, 384), (312, 500)]
    assert [c.last for c in chunks] == [False] * 4 + [True]
    assert schedule.chunk(2, received=191, total=None) is None  # its future block has not arrived yet
    assert schedule.chunk(2, received=192, total=None) == chunks[2]
    assert schedule.chunk(0, total, total, whole=True) == Chunk(0, 0, total, 0, total, last=True)
    release = Schedule(24, 2, first_chunk_blocks=3, chunk_blocks=3)
    assert [release.chunk_start(i) for i in range(4)] == [0, 72, 144, 216]


def test_too_little_future_context_is_audibly_wrong(tiny: Path, answer: tuple[torch.Tensor, torch.Tensor]) -> None:
    model = Token2Wav.from_checkpoint(tiny)
    condition = model.condition(speakers(tiny)["Chelsie"])

    def streamed(**blocks: int) -> torch.Tensor:
        stream = SpeechStream(
            Schedule(24, 2, **blocks), condition, NoiseStream(0, model.mel_dim), model.points, whole=False
        )
        return decode(model, stream, answer[0])

    wav = answer[1]
    assert snr_db(wav, streamed()) >= MIN_STREAMED_SNR_DB
    assert snr_db(wav, streamed(future_blocks=0)) < 50


def test_warm_up_decodes_once_and_keeps_nothing(tiny: Path, answer: tuple[torch.Tensor, torch.Tensor]) -> None:
    stage = create_token2wav_stage(model_dir=str(tiny))
    stage.warm_up_serving_thread()
    assert stage.active_streams == 0 and set(stage._conditions) == {"Chelsie", "Ethan"}
    with running(stage):
        codes, wav = answer
        assert np.array_equal(speak(stage, "r", codes, Voice("Chelsie", 0, stream=False)), wav.numpy())


def test_more_threads_decode_generates_audio_on_that_many_threads(
    tiny: Path, answer: tuple[torch.Tensor, torch.Tensor]
) -> None:
    caller_threads = torch.get_num_threads()
    try:
        with pytest.raises(ValueError, match="threads"):
            create_token2wav_stage(model_dir=str(tiny), threads=0)
        stage = create_token2wav_stage(model_dir=str(tiny), threads=2)
        seen: set[int] = set()
        velocities = stage.model.velocities

        def counted(rows: Any) -> Any:
            seen.add(torch.get_num_threads())
            return velocities(rows)

        stage.model.velocities = counted  # type: ignore[method-assign]
        with running(stage, warm_up=True):
            codes, wav = answer
            audio = speak(stage, "r", codes, Voice("Chelsie", 0, stream=False))
        assert seen == {2}
        assert snr_db(wav, audio) >= MIN_ROUNDING_SNR_DB  # other reduction orders: float rounding only
    finally:
        torch.set_num_threads(caller_threads)


def test_bigvgan_forwards_stay_within_their_frames_and_equal_each_mel_alone(tiny: Path) -> None:
    model = Token2Wav.from_checkpoint(tiny)
    generator = torch.Generator().manual_seed(0)
    mels = [torch.randn(frames, model.mel_dim, generator=generator) for frames in (30, 30, 50, 30, 30, 50, 30)]
    forwards: list[tuple[int, int]] = []
    bigvgan = model.bigvgan.forward

    def counted(batch: torch.Tensor) -> torch.Tensor:
        forwards.append((int(batch.shape[0]), int(batch.shape[2])))
        return bigvgan(batch)

    model.bigvgan.forward = counted
    waves = model.vocode(mels, max_frames=70)
    assert sorted(forwards) == [(1, 30), (1, 50), (1, 50), (2, 30), (2, 30)]  # a mel alone always fits
    for mel, wave in zip(mels, waves, strict=True):
        assert snr_db(model.vocode([mel])[0], wave) >= MIN_ROUNDING_SNR_DB
