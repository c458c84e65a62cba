"""StreamingVocoderBase and BatchVocoderBase driven directly: threads, inbox, outbox."""

from __future__ import annotations

import asyncio
from typing import Any

import attrs
import pytest

from omnitrio.contract import IncomingMessage, OmniRequest, OutgoingMessage, StagePayload, StreamItem
from schedulers.vocoder import BatchVocoderBase, StreamingVocoderBase, resolve_initial_codec_chunk_frames
from tests.scheduler_harness import done, put_atomically, running, take, until_final

# A fake codec: code c decodes to the sample c * 100; the last code is held back as look-ahead ------


@attrs.define(eq=False)
class Codes:
    buffer: list[int] = attrs.field(factory=list)
    emitted: list[int] = attrs.field(factory=list)
    params: dict[str, Any] = attrs.field(factory=dict)


class MultiplyingVocoder(StreamingVocoderBase[Codes]):
    sample_rate = 16000

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(self.whole, **kwargs)
        self.created: list[str] = []
        self.released: list[str] = []
        self.fail_on: set[str] = set()

    def whole(self, payload: StagePayload) -> StagePayload:
        payload.data = {"samples": [c * 100 for c in payload.data["codes"]]}
        return payload

    def create_stream_state(self, request_id: str) -> Codes:
        self.created.append(request_id)
        return Codes()

    def latch_stream_contract(self, request_id: str, state: Codes, source: Any, *, origin: str) -> None:
        if origin == "payload":
            state.params = dict(source.request.params)

    def validate_chunk(self, request_id: str, state: Codes, codes: Any) -> list[int]:
        if request_id in self.fail_on or not isinstance(codes, list):
            raise ValueError(f"codes must be a list, got {codes!r}")
        return codes

    def ingest(self, request_id: str, state: Codes, codes: list[int]) -> None:
        state.buffer.extend(codes)

    def decode_delta(self, request_id: str, state: Codes, *, is_final: bool) -> list[int] | None:
        ready = state.buffer if is_final else state.buffer[:-1]
        if not ready:
            return None
        state.buffer = state.buffer[len(ready) :]
        samples = [c * 100 for c in ready]
        state.emitted.extend(samples)
        return samples

    def final_result_data(self, request_id: str, payload: StagePayload, state: Codes) -> dict[str, Any]:
        return {"samples": state.emitted, "voice": state.params.get("voice")}

    def release_stream_resources(self, request_id: str, state: Codes) -> None:
        self.released.append(request_id)


def streaming(rid: str, **params: Any) -> IncomingMessage:
    request = OmniRequest(inputs=None, params={"stream": True, **params})
    return IncomingMessage(rid, "new_request", StagePayload(rid, request, {}))


def codes(rid: str, chunk_id: int, data: Any, modality: str | None = "audio_codes") -> IncomingMessage:
    metadata = None if modality is None else {"modality": modality}
    return IncomingMessage(rid, "stream_chunk", StreamItem(chunk_id, data, "talker", metadata))


def whole(rid: str, data: list[int]) -> IncomingMessage:
    return IncomingMessage(rid, "new_request", StagePayload(rid, OmniRequest(inputs=None), {"codes": data}))


def fence(s: Any, rid: str = "fence") -> None:
    """Round-trip a non-streaming request: everything put before it has been handled."""
    s.inbox.put(whole(rid, [1]))
    out = take(s.outbox)[0]
    assert (out.request_id, out.type) == (rid, "result"), out


def samples(outputs: list[OutgoingMessage]) -> list[list[int]]:
    return [out.data["pcm"] for out in outputs if out.type == "stream"]


# Streaming ---------------------------------------------------------------------------------------


def test_chunks_stream_audio_as_they_come_and_done_flushes_the_tail() -> None:
    with running(MultiplyingVocoder()) as s:
        s.inbox.put(codes("r", 0, [1, 2]))
        (first,) = take(s.outbox)
        assert (first.type, first.data, first.metadata) == (
            "stream",
            {"pcm": [100], "sample_rate": 16000},
            {"modality": "audio"},
        )
        put_atomically(s.inbox, [codes("r", 1, [3]), streaming("r", voice="amy"), done("r")])
        outputs = until_final(s, "r")
    assert samples(outputs) == [[200], [300]]
    result = outputs[-1]
    assert result.type == "result" and result.data.data == {"samples": [100, 200, 300], "voice": "amy"}
    assert s.released == ["r"]


def test_done_before_payload_keeps_the_held_back_tail() -> None:
    with running(MultiplyingVocoder()) as s:
        put_atomically(s.inbox, [codes("r", 0, [1, 2]), codes("r", 1, [3]), done("r")])
        assert samples(take(s.outbox, 2)) == [[100], [200]]
        s.inbox.put(streaming("r"))
        outputs = until_final(s, "r")
    assert samples(outputs) == [[300]]
    assert outputs[-1].data.data["samples"] == [100, 200, 300]
    assert s.created == ["r"]


def test_payload_before_chunks_uses_the_same_state() -> None:
    with running(MultiplyingVocoder()) as s:
        put_atomically(s.inbox, [streaming("r", voice="bo"), codes("r", 0, [4, 5]), done("r")])
        outputs = until_final(s, "r")
    assert samples(outputs) == [[400], [500]]
    assert outputs[-1].data.data == {"samples": [400, 500], "voice": "bo"}
    assert s.created == ["r"]


def test_payload_and_done_without_chunks_give_a_result_without_audio() -> None:
    with running(MultiplyingVocoder()) as s:
        put_atomically(s.inbox, [streaming("r"), done("r")])
        outputs = until_final(s, "r")
    assert [o.type for o in outputs] == ["result"]
    assert outputs[0].data.data["samples"] == []


def test_fallback_full_decode_runs_when_nothing_was_emitted() -> None:
    class Fallback(MultiplyingVocoder):
        def fallback_full_decode(self, request_id: str, payload: StagePayload, state: Codes) -> list[int]:
            return [-1]

    with running(Fallback()) as s:
        put_atomically(s.inbox, [streaming("r"), done("r")])
        outputs = until_final(s, "r")
    assert samples(outputs) == [[-1]]


def test_late_chunk_after_abort_creates_no_state() -> None:
    with running(MultiplyingVocoder()) as s:
        s.inbox.put(codes("r", 0, [1, 2]))
        take(s.outbox)
        s.abort("r")
        put_atomically(s.inbox, [codes("r", 1, [3, 4]), done("r")])
        fence(s)
        assert s.active_streams == 0
        assert s.created == ["r"]
        assert s.released == ["r"]
    assert s.outbox.empty()


def test_late_chunk_after_completion_creates_no_state() -> None:
    with running(MultiplyingVocoder()) as s:
        put_atomically(s.inbox, [streaming("r"), codes("r", 0, [1]), done("r")])
        until_final(s, "r")
        s.inbox.put(codes("r", 1, [2, 3]))
        fence(s)
        assert s.active_streams == 0
        assert s.created == ["r"]
    assert s.outbox.empty()


def test_a_reused_id_streams_again_from_its_first_chunk() -> None:
    with running(MultiplyingVocoder()) as s:
        put_atomically(s.inbox, [streaming("r"), codes("r", 0, [1]), done("r")])
        until_final(s, "r")
        put_atomically(s.inbox, [codes("r", 0, [7]), done("r"), streaming("r")])
        outputs = until_final(s, "r")
    assert outputs[-1].data.data["samples"] == [700]
    assert s.created == ["r", "r"]


def test_a_failing_hook_fails_only_its_request() -> None:
    with running(MultiplyingVocoder()) as s:
        s.fail_on.add("bad")
        put_atomically(s.inbox, [codes("bad", 0, [1, 2]), codes("good", 0, [1, 2])])
        error, streamed = take(s.outbox, 2)
        assert (error.request_id, error.type) == ("bad", "error")
        assert "codes must be a list" in str(error.data)
        assert (streamed.request_id, streamed.type) == ("good", "stream")
        put_atomically(s.inbox, [codes("bad", 1, [3]), streaming("good"), done("good")])
        assert until_final(s, "good")[-1].data.data["samples"] == [100, 200]
        fence(s)
        assert s.active_streams == 0
    assert sorted(s.released) == ["bad", "good"]


def test_a_chunk_of_another_modality_fails_the_request_naming_it() -> None:
    with running(MultiplyingVocoder()) as s:
        s.inbox.put(codes("r", 0, [1], modality="text"))
        (out,) = take(s.outbox)
    assert out.type == "error"
    assert "modality 'text'" in str(out.data) and "'audio_codes'" in str(out.data)


def test_chunks_without_metadata_are_accepted() -> None:
    with running(MultiplyingVocoder()) as s:
        s.inbox.put(codes("r", 0, [1, 2], modality=None))
        assert take(s.outbox)[0].data["pcm"] == [100]


def test_non_streaming_payload_is_computed_whole() -> None:
    with running(MultiplyingVocoder()) as s:
        s.inbox.put(whole("w", [1, 2, 3]))
        (out,) = take(s.outbox)
    assert out.data.data == {"samples": [100, 200, 300]}
    assert s.created == []


def test_stop_releases_every_live_state() -> None:
    vocoder = MultiplyingVocoder()
    with running(vocoder) as s:
        put_atomically(s.inbox, [codes("a", 0, [1, 2]), codes("b", 0, [1, 2])])
        take(s.outbox, 2)
    assert sorted(vocoder.released) == ["a", "b"]
    assert vocoder.active_streams == 0


def test_non_dict_params_fail_the_request_with_a_clear_error() -> None:
    request = OmniRequest(inputs=None)
    request.params = ["stream"]  # type: ignore[assignment]
    with running(MultiplyingVocoder()) as s:
        s.inbox.put(IncomingMessage("r", "new_request", StagePayload("r", request, {})))
        (out,) = take(s.outbox)
    assert out.type == "error" and "params must be a dict" in str(out.data)


def test_a_vocoder_without_sample_rate_is_rejected() -> None:
    class NoRate(MultiplyingVocoder):
        sample_rate = 0

    with pytest.raises(ValueError, match="sample_rate"):
        NoRate()
    assert NoRate(sample_rate=8000).sample_rate == 8000


def test_a_vocoder_missing_a_hook_cannot_be_built() -> None:
    class Incomplete(StreamingVocoderBase[Codes]):
        sample_rate = 16000

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()  # type: ignore[abstract]


def test_initial_codec_chunk_frames_is_clamped_to_the_steady_size() -> None:
    assert resolve_initial_codec_chunk_frames({"initial_codec_chunk_frames": 50}, steady_chunk_frames=25) == 25
    assert resolve_initial_codec_chunk_frames({}, steady_chunk_frames=25, default_frames=5) == 5
    with pytest.raises(ValueError, match=">= 0"):
        resolve_initial_codec_chunk_frames({"initial_codec_chunk_frames": -1}, steady_chunk_frames=25)


# Batch ---------------------------------------------------------------------------------------------


class ToyBatchVocoder(BatchVocoderBase[str, list[int]]):
    """Decodes codes c to samples c * 10; records the batch sizes it saw."""

    def __init__(self, *, asynchronous: bool = True) -> None:
        self.batches: list[int] = []
        self.asynchronous = asynchronous

    def prepare_item(self, payload: StagePayload) -> tuple[str, list[int]]:
        data = payload.data["codes"]
        if not isinstance(data, list):
            raise TypeError(f"codes must be a list, got {data!r}")
        return payload.request_id, data

    def decode_batch(self, items: list[tuple[str, list[int]]]) -> Any:
        self.batches.append(len(items))
        decoded = [([c * 10 for c in item], 8000) for _, item in items]
        if not self.asynchronous:
            return decoded

        async def later() -> list[tuple[list[int], int]]:
            await asyncio.sleep(0)
            return decoded

        return later()

    def store_result(self, payload: StagePayload, state: str, wav: Any, sample_rate: int) -> StagePayload:
        payload.data = {"wav": wav, "sample_rate": sample_rate, "state": state}
        return payload


def batch_of(*items: tuple[str, Any]) -> list[IncomingMessage]:
    return [whole(rid, data) for rid, data in items]


@pytest.mark.parametrize("asynchronous", [True, False])
def test_batch_vocoder_decodes_a_burst_as_one_batch(asynchronous: bool) -> None:
    vocoder = ToyBatchVocoder(asynchronous=asynchronous)
    with running(vocoder.build_scheduler(max_batch_size=8)) as s:
        put_atomically(s.inbox, batch_of(("a", [1]), ("b", [2, 3]), ("c", [4])))
        outs = {o.request_id: o for o in take(s.outbox, 3)}
    assert vocoder.batches == [3]
    assert outs["b"].data.data == {"wav": [20, 30], "sample_rate": 8000, "state": "b"}


def test_batch_vocoder_failure_in_prepare_fails_only_that_request() -> None:
    vocoder = ToyBatchVocoder()
    with running(vocoder.build_scheduler(max_batch_size=8)) as s:
        put_atomically(s.inbox, batch_of(("a", [1]), ("bad", "oops"), ("c", [4])))
        outs = {o.request_id: o for o in take(s.outbox, 3)}
    assert (outs["a"].type, outs["bad"].type, outs["c"].type) == ("result", "error", "result")
    assert "codes must be a list" in str(outs["bad"].data)
    assert vocoder.batches == [2]


def test_batch_vocoder_with_wrong_result_count_fails_the_batch() -> None:
    class Short(ToyBatchVocoder):
        def decode_batch(self, items: list[tuple[str, list[int]]]) -> Any:
            return [([0], 8000)]

    with running(Short().build_scheduler(max_batch_size=8)) as s:
        put_atomically(s.inbox, batch_of(("a", [1]), ("b", [2])))
        outs = take(s.outbox, 2)
    assert {o.type for o in outs} == {"error"}
    assert "returned 1 results for 2 items" in str(outs[0].data)
