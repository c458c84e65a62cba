"""Talker frames stream into the Griffin-Lim vocoder and come out as audio of the right length."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from omnitrio.contract import IncomingMessage, OmniRequest, OutgoingMessage, StagePayload, StreamItem
from schedulers.ar.talker import TalkerScheduler, TinyTalker
from schedulers.ar.vocoder import GriffinLimVocoder, GriffinLimVocoderScheduler, StreamingGriffinLim, mel_filterbank

torch.set_num_threads(1)

HOP = 256
VOCODER = GriffinLimVocoder(n_fft=1024, hop=HOP, n_iter=4)


@pytest.fixture
def serve() -> Iterator:
    started: list[tuple[object, threading.Thread]] = []

    def run(scheduler):
        thread = threading.Thread(target=scheduler.start)
        thread.start()
        started.append((scheduler, thread))
        return scheduler

    yield run
    for scheduler, thread in started:
        scheduler.stop()  # type: ignore[attr-defined]
        thread.join(timeout=10)
        assert not thread.is_alive()


def payload(rid: str, data: dict) -> StagePayload:
    return StagePayload(rid, OmniRequest(None), data)


def until_result(outbox, rid: str) -> list[OutgoingMessage]:
    seen: list[OutgoingMessage] = []
    while not seen or seen[-1].type not in ("result", "error"):
        out = outbox.get(timeout=10)
        assert out.request_id == rid
        seen.append(out)
    return seen


def test_whole_decode_gives_hop_samples_per_frame() -> None:
    audio = VOCODER.decode(np.full((10, 80), -3.0, np.float32))
    assert audio.dtype == np.float32 and audio.shape == (10 * HOP,)
    assert np.abs(audio).max() > 0


def test_streamed_decode_gives_the_same_number_of_samples_as_whole_decode() -> None:
    stream = StreamingGriffinLim(VOCODER, context=4, lookahead=2)
    mel = torch.randn(37, 80) - 3
    chunks = [stream.push(mel[i : i + 5]) for i in range(0, 37, 5)] + [stream.flush()]
    assert all(len(c) % HOP == 0 for c in chunks)
    assert sum(len(c) for c in chunks) == 37 * HOP


def test_mel_filterbank_covers_every_band() -> None:
    bank = mel_filterbank(24000, 1024, 80)
    assert bank.shape == (80, 513) and bool((bank.sum(dim=1) > 0).all())


def test_talker_streams_frames_per_token_in_chunks(serve) -> None:
    talker = serve(TalkerScheduler(TinyTalker(vocab_size=100, frames_per_token=3), chunk_frames=4))
    talker.inbox.put(IncomingMessage("t", "new_request", payload("t", {"output_token_ids": [1, 2, 3, 4, 5]})))
    outputs = until_result(talker.outbox, "t")
    sizes = [o.data["mel"].shape for o in outputs if o.type == "stream"]
    assert sizes == [(4, 80)] * 3 + [(3, 80)]
    assert outputs[-1].data.data["num_frames"] == 15


def test_talker_and_vocoder_produce_audio_chunks_of_the_expected_length(serve) -> None:
    talker = serve(TalkerScheduler(TinyTalker(vocab_size=100, frames_per_token=4), chunk_frames=6))
    vocoder = serve(GriffinLimVocoderScheduler(VOCODER, context=4, lookahead=2))
    tokens = [7, 8, 9, 10, 11]
    talker.inbox.put(IncomingMessage("v", "new_request", payload("v", {"output_token_ids": tokens})))
    chunk_id = 0
    for out in until_result(talker.outbox, "v"):
        if out.type == "stream":  # the stage would route these; the chunks arrive before the payload
            vocoder.inbox.put(IncomingMessage("v", "stream_chunk", StreamItem(chunk_id, out.data, "talker")))
            chunk_id += 1
    vocoder.inbox.put(IncomingMessage("v", "stream_done", "talker"))
    vocoder.inbox.put(IncomingMessage("v", "new_request", payload("v", {})))
    outputs = until_result(vocoder.outbox, "v")
    audio = [o for o in outputs if o.type == "stream"]
    assert len(audio) > 1
    assert all(o.metadata == {"modality": "audio"} and o.data["sample_rate"] == 24000 for o in audio)
    assert all(o.data["pcm"].dtype == np.int16 for o in audio)
    total = len(tokens) * 4 * HOP
    assert sum(len(o.data["pcm"]) for o in audio) == total
    assert outputs[-1].data.data["num_samples"] == total


def test_vocoder_chunks_after_abort_do_not_recreate_state(serve) -> None:
    vocoder = serve(GriffinLimVocoderScheduler(VOCODER))
    vocoder.inbox.put(IncomingMessage("a", "stream_chunk", StreamItem(0, {"mel": np.zeros((20, 80))}, "talker")))
    vocoder.abort("a")
    vocoder.inbox.put(IncomingMessage("a", "stream_chunk", StreamItem(1, {"mel": np.zeros((20, 80))}, "talker")))
    vocoder.inbox.put(IncomingMessage("b", "new_request", payload("b", {"mel": np.zeros((3, 80))})))
    outputs = until_result_any(vocoder.outbox, "b")
    assert [o.request_id for o in outputs if o.request_id == "a" and o.type != "stream"] == []
    assert outputs[-1].data.data["num_samples"] == 3 * HOP
    assert vocoder.active_requests == 0


def test_bad_vocoder_chunk_fails_only_its_request(serve) -> None:
    vocoder = serve(GriffinLimVocoderScheduler(VOCODER))
    vocoder.inbox.put(IncomingMessage("bad", "stream_chunk", StreamItem(0, "not mel", "talker")))
    (out,) = until_result(vocoder.outbox, "bad")
    assert out.type == "error" and "must be {'mel'" in str(out.data)


def until_result_any(outbox, rid: str) -> list[OutgoingMessage]:
    seen: list[OutgoingMessage] = []
    while not seen or (seen[-1].request_id, seen[-1].type) != (rid, "result"):
        seen.append(outbox.get(timeout=10))
    return seen
