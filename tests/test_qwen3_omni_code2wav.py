"""The code2wav stage driven directly (inbox/outbox): streamed speech equals transformers' whole decode.

The reference is ``Qwen3OmniMoeCode2Wav.chunked_decode(codes)`` with its defaults, what
``Qwen3OmniMoeForConditionalGeneration.generate(return_audio=True)`` returns for one request.
"""

from __future__ import annotations

import itertools
import queue
from collections.abc import Iterator
from pathlib import Path

import attrs
import numpy as np
import pytest
import torch

from omnitrio.contract import IncomingMessage, OutgoingMessage, StreamItem
from schedulers.qwen3_omni.code2wav.model import Code2WavRunner, decode_whole, geometry, to_pcm16
from schedulers.qwen3_omni.code2wav.stage import Qwen3OmniCode2WavScheduler, create_code2wav_stage
from schedulers.qwen3_omni.code2wav.windows import Chunking, CodeStream, Geometry
from schedulers.qwen3_omni.handoffs import Codes, TalkerResult
from schedulers.qwen3_omni.tiny import write_checkpoint
from tests.scheduler_harness import TIMEOUT, done, new, put_atomically, running
from toys.qwen3_omni_code2wav import build_code2wav, random_codes
from toys.qwen3_omni_reference import load_reference_model

FIRST, CHUNK = 5, 25
MIN_FLOAT_SNR_DB = 95.0  # the stream's float samples against the reference: float rounding only
MIN_SNR_DB = 80.0  # against the reference in pcm16: float rounding flips a rare sample by 1 LSB


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.set_num_threads(1)  # as the stage's factory does; more threads only contend on a loaded machine
    return build_code2wav("tiny", seed=0)


@pytest.fixture
def scheduler(model: torch.nn.Module) -> Iterator[Qwen3OmniCode2WavScheduler]:
    with running(Qwen3OmniCode2WavScheduler(model, Chunking(FIRST, CHUNK))) as sched:
        yield sched


def reference(model: torch.nn.Module, codes: torch.Tensor) -> np.ndarray:
    with torch.inference_mode():
        return model.chunked_decode(codes.unsqueeze(0))[0, 0].numpy()


def chunk(rid: str, chunk_id: int, codes: torch.Tensor) -> IncomingMessage:
    return IncomingMessage(rid, "stream_chunk", StreamItem(chunk_id, Codes(codes), "talker"))


def talk(rid: str, codes: torch.Tensor, step: int) -> list[IncomingMessage]:
    """What the talker sends: chunks of ``step`` frames, then its result and the end of its stream."""
    frames = codes.shape[-1]
    chunks = [chunk(rid, i, codes[:, start : start + step]) for i, start in enumerate(range(0, frames, step))]
    return [*chunks, new(rid, TalkerResult(frames)), done(rid)]


def collect(outbox: queue.Queue[OutgoingMessage], rids: set[str]) -> dict[str, tuple[list[np.ndarray], object]]:
    """Every request's pcm chunks and its result (or error), reading until each has ended."""
    streams: dict[str, list[np.ndarray]] = {rid: [] for rid in rids}
    ends: dict[str, object] = {}
    while len(ends) < len(rids):
        msg = outbox.get(timeout=TIMEOUT * 10)
        if msg.type == "stream":
            assert msg.data["sample_rate"] == 24_000 and msg.data["pcm"].dtype == np.int16
            streams[msg.request_id].append(msg.data["pcm"])
        else:
            ends[msg.request_id] = msg.data if msg.type == "result" else msg
    return {rid: (streams[rid], ends[rid]) for rid in rids}


def until_end(outbox: queue.Queue[OutgoingMessage], rid: str) -> list[OutgoingMessage]:
    """Every output, of any request, up to and including ``rid``'s result or error."""
    outputs = [outbox.get(timeout=TIMEOUT * 10)]
    while outputs[-1].request_id != rid or outputs[-1].type == "stream":
        outputs.append(outbox.get(timeout=TIMEOUT * 10))
    return outputs


def speak(scheduler: Qwen3OmniCode2WavScheduler, rid: str, codes: torch.Tensor, step: int) -> np.ndarray:
    put_atomically(scheduler.inbox, talk(rid, codes, step))
    ((chunks, result),) = collect(scheduler.outbox, {rid}).values()
    pcm = np.concatenate(chunks) if chunks else np.zeros(0, np.int16)
    assert result.data == {"num_samples": len(pcm), "num_frames": codes.shape[-1], "sample_rate": 24_000}
    return pcm


def snr_db(ref: np.ndarray, pcm: np.ndarray) -> float:
    ref, pcm = ref.astype(np.float64), pcm.astype(np.float64)
    return float(10 * np.log10(np.sum(ref**2) / max(np.sum((ref - pcm) ** 2), 1e-30)))


@pytest.mark.parametrize(
    "frames",
    [1, 3, FIRST, 25, 87, 320],
    ids=["one-frame", "under-first-chunk", "first-chunk", "ends-on-a-window", "many-chunks", "past-300"],
)
def test_streamed_speech_is_transformers_whole_decode(
    model: torch.nn.Module, scheduler: Qwen3OmniCode2WavScheduler, frames: int
) -> None:
    codes = random_codes(model, frames, seed=frames)
    ref = reference(model, codes)
    pcm = speak(scheduler, "r", codes, step=4)
    assert len(pcm) == len(ref) == frames * 1920 - 555 * -(-frames // 300)
    ref_pcm = to_pcm16(torch.from_numpy(ref))
    assert np.abs(pcm.astype(np.int32) - ref_pcm).max() <= 1
    assert snr_db(ref_pcm, pcm) >= MIN_SNR_DB


def test_speech_does_not_depend_on_how_the_talker_chunks_its_codes(
    model: torch.nn.Module, scheduler: Qwen3OmniCode2WavScheduler
) -> None:
    codes = random_codes(model, 61, seed=1)
    one_by_one = speak(scheduler, "a", codes, step=1)
    all_at_once = speak(scheduler, "b", codes, step=61)
    assert np.array_equal(one_by_one, all_at_once)


def test_the_end_of_the_stream_may_come_before_the_talkers_result(
    model: torch.nn.Module, scheduler: Qwen3OmniCode2WavScheduler
) -> None:
    codes = random_codes(model, 12, seed=10)
    *chunks, result, end = talk("r", codes, step=5)
    put_atomically(scheduler.inbox, [*chunks, end, result])
    ((pcm, outcome),) = collect(scheduler.outbox, {"r"}).values()
    assert outcome.data["num_samples"] == sum(map(len, pcm)) == 12 * 1920 - 555


def test_no_frames_is_no_audio(scheduler: Qwen3OmniCode2WavScheduler) -> None:
    put_atomically(scheduler.inbox, [new("r", TalkerResult(0)), done("r")])
    ((chunks, result),) = collect(scheduler.outbox, {"r"}).values()
    assert chunks == [] and result.data["num_samples"] == 0
    assert scheduler.active_streams == 0


def test_first_audio_leaves_once_the_first_chunk_of_frames_arrived(
    model: torch.nn.Module, scheduler: Qwen3OmniCode2WavScheduler
) -> None:
    codes = random_codes(model, FIRST, seed=2)
    for i in range(FIRST - 1):
        scheduler.inbox.put(chunk("r", i, codes[:, i : i + 1]))
    scheduler.inbox.put(chunk("r", FIRST - 1, codes[:, FIRST - 1 :]))
    first = scheduler.outbox.get(timeout=TIMEOUT)
    assert first.type == "stream" and len(first.data["pcm"]) == FIRST * 1920 - 555
    put_atomically(scheduler.inbox, [new("r", TalkerResult(FIRST)), done("r")])
    (result,) = until_end(scheduler.outbox, "r")  # the first chunk was all of the audio: nothing came after it
    assert result.type == "result" and result.data.data["num_samples"] == FIRST * 1920 - 555


def test_concurrent_requests_share_forwards_and_equal_their_solo_speech(
    model: torch.nn.Module, scheduler: Qwen3OmniCode2WavScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    lengths = {"a": 40, "b": 55, "c": 7, "d": 80}
    codes = {rid: random_codes(model, n, seed=n) for rid, n in lengths.items()}
    solo = {rid: speak(scheduler, rid, codes[rid], step=5) for rid in lengths}
    runner = scheduler.runner
    forwards: list[int] = []
    convolve = runner._convolve
    monkeypatch.setattr(runner, "_convolve", lambda hidden: forwards.append(hidden.shape[0]) or convolve(hidden))
    talks = [talk(rid, codes[rid], step=5) for rid in lengths]
    put_atomically(scheduler.inbox, [msg for turn in itertools.zip_longest(*talks) for msg in turn if msg])
    for rid, (chunks, _result) in collect(scheduler.outbox, set(lengths)).items():
        batched = np.concatenate(chunks).astype(np.int32)
        assert len(batched) == len(solo[rid])
        assert np.abs(batched - solo[rid]).max() <= 1  # float rounding may differ with the batch shape
    assert max(forwards) >= len(lengths)


def test_abort_mid_stream_frees_the_request(model: torch.nn.Module, scheduler: Qwen3OmniCode2WavScheduler) -> None:
    codes = random_codes(model, 60, seed=3)
    put_atomically(scheduler.inbox, talk("r", codes, step=10)[:3])
    assert scheduler.outbox.get(timeout=TIMEOUT).type == "stream"
    scheduler.abort("r")
    assert speak(scheduler, "sync", codes[:, :3], step=3).size  # the abort's cleanup came before it
    assert scheduler.active_streams == 0


def test_a_chunk_after_abort_does_not_recreate_the_request(
    model: torch.nn.Module, scheduler: Qwen3OmniCode2WavScheduler
) -> None:
    codes = random_codes(model, 30, seed=4)
    chunks = talk("r", codes, step=FIRST - 1)  # the first chunk alone makes no audio
    scheduler.inbox.put(chunks[0])
    speak(scheduler, "sync-1", codes[:, :3], step=3)  # the inbox is in order: the first chunk is in
    assert scheduler.active_streams == 1
    scheduler.abort("r")
    put_atomically(scheduler.inbox, [*chunks[1:4], *talk("sync-2", codes[:, :3], step=3)])  # in order, as sent
    outputs = until_end(scheduler.outbox, "sync-2")  # the later chunks were handled before sync-2 ended
    assert {out.request_id for out in outputs} == {"sync-2"} and outputs[-1].type == "result"
    assert scheduler.active_streams == 0


def test_codes_of_the_wrong_shape_fail_only_their_request(
    model: torch.nn.Module, scheduler: Qwen3OmniCode2WavScheduler
) -> None:
    codes = random_codes(model, 12, seed=5)
    put_atomically(scheduler.inbox, [chunk("bad", 0, codes[:2]), *talk("good", codes, step=6)])
    outcomes = collect(scheduler.outbox, {"bad", "good"})
    error = outcomes["bad"][1]
    assert isinstance(error, OutgoingMessage) and "'codes' of 'bad' must have shape [4, n >= 1]" in str(error.data)
    assert outcomes["good"][1].data["num_frames"] == 12
    assert scheduler.active_streams == 0


def test_a_frame_count_that_disagrees_with_the_stream_is_an_error(
    model: torch.nn.Module, scheduler: Qwen3OmniCode2WavScheduler
) -> None:
    codes = random_codes(model, 8, seed=6)
    put_atomically(scheduler.inbox, [chunk("r", 0, codes), new("r", TalkerResult(9)), done("r")])
    ((_chunks, error),) = collect(scheduler.outbox, {"r"}).values()
    assert "num_frames=9, but 8 frames arrived" in str(error.data)
    assert scheduler.active_streams == 0


def test_geometry_is_what_the_model_decodes(model: torch.nn.Module) -> None:
    shape = geometry(model)
    assert (shape.samples_per_frame, shape.tail_samples) == (1920, 555)
    with torch.inference_mode():
        assert model(random_codes(model, 3).unsqueeze(0)).shape[-1] == 3 * 1920 - 555


def test_pcm16_is_clipped_scaled_and_rounded() -> None:
    samples = torch.tensor([-2.0, -1.0, -0.5, 0.0, 0.4 / 32767, 0.6 / 32767, 1.0, 3.0])
    assert to_pcm16(samples).tolist() == [-32767, -32767, -16384, 0, 0, 1, 32767, 32767]


@pytest.mark.parametrize("frames", [87, 320])
def test_the_stream_in_float_is_the_whole_decode_up_to_rounding(model: torch.nn.Module, frames: int) -> None:
    codes = random_codes(model, frames, seed=7)
    streamed = decode_whole(Code2WavRunner(model), Chunking(FIRST, CHUNK), codes).numpy()
    assert snr_db(reference(model, codes), streamed) >= MIN_FLOAT_SNR_DB


def test_too_little_convolution_context_is_audibly_wrong(model: torch.nn.Module) -> None:
    codes = random_codes(model, 87, seed=8)
    runner = Code2WavRunner(model)
    runner.geometry = attrs.evolve(runner.geometry, conv_context_frames=runner.geometry.conv_context_frames // 2)
    assert snr_db(reference(model, codes), decode_whole(runner, Chunking(FIRST, CHUNK), codes).numpy()) < 70


def test_the_stage_speaks_as_transformers_on_a_checkpoint(tmp_path: Path) -> None:
    model_dir = write_checkpoint(tmp_path / "checkpoint", size="tiny")
    whole = load_reference_model(model_dir).code2wav  # transformers' from_pretrained of the whole model
    codes = random_codes(whole, 40, seed=9)
    ref_pcm = to_pcm16(torch.from_numpy(reference(whole, codes)))
    with running(create_code2wav_stage(model_dir=str(model_dir))) as stage:
        pcm = speak(stage, "r", codes, step=3)
    assert len(pcm) == len(ref_pcm) and np.abs(pcm.astype(np.int32) - ref_pcm).max() <= 1


def test_windows_ramp_from_the_first_chunk_to_the_steady_size_and_restart_at_each_reference_segment() -> None:
    stream = CodeStream(Chunking(FIRST, CHUNK), Geometry(1920, 555, 10), num_quantizers=1)
    stream.add(torch.zeros(1, 340, dtype=torch.long))
    stream.finish(340)
    windows = [(w.segment.index, w.start, w.end) for w in stream.take_windows(10_000)]
    first_segment = [5, 13, 25, 43, 68, 93, 118, 143, 168, 193, 218, 243, 268, 293, 300]  # 5, 8, 12, 18, 25...
    assert windows == [
        *((0, start, end) for start, end in zip([0, *first_segment], first_segment, strict=False)),
        (1, 275, 325),  # transformers' 25 frames of context, then one steady window
        (1, 325, 340),
    ]
