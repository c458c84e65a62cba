"""StreamingDetokenizeScheduler driven directly: token chunks in, UTF-8-safe text deltas out."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

from omnitrio.contract import IncomingMessage, OmniRequest, OutgoingMessage, StagePayload, StreamItem
from schedulers.ar.tokenizer import ByteTokenizer, load_tokenizer
from schedulers.detokenize import StreamingDetokenizeScheduler, TextStream, token_ids_of
from tests.scheduler_harness import TIMEOUT, done, put_atomically, running, take, until_final

EOS = 256
TEXT = "héllo 世界 🎉"
BYTES = list(TEXT.encode("utf-8"))


class Bytes:
    """Token id = byte value (0..255), so a multi-byte character is several tokens."""

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def detokenizer(**kwargs: Any) -> StreamingDetokenizeScheduler:
    return StreamingDetokenizeScheduler(Bytes(), EOS, **kwargs)


def payload(rid: str, data: Any = None, *, stream: bool = True) -> IncomingMessage:
    request = OmniRequest(inputs=None, params={"stream": stream})
    return IncomingMessage(rid, "new_request", StagePayload(rid, request, {} if data is None else data))


def tokens(rid: str, chunk_id: int, data: Any) -> IncomingMessage:
    return IncomingMessage(rid, "stream_chunk", StreamItem(chunk_id, data, "thinker", {"modality": "tokens"}))


def splits(ids: list[int], max_cuts: int | None = None) -> list[list[list[int]]]:
    """Every way to cut ``ids`` into consecutive non-empty chunks (at most ``max_cuts`` cuts)."""
    gaps = range(1, len(ids))
    counts = range(len(ids)) if max_cuts is None else range(max_cuts + 1)
    out = []
    for count in counts:
        for cuts in itertools.combinations(gaps, count):
            bounds = [0, *cuts, len(ids)]
            out.append([ids[a:b] for a, b in itertools.pairwise(bounds)])
    return out


def deltas(outputs: list[OutgoingMessage]) -> list[str]:
    return [o.data for o in outputs if o.type == "stream"]


def fence(s: StreamingDetokenizeScheduler, rid: str = "fence") -> None:
    s.inbox.put(payload(rid, {"output_token_ids": [104]}, stream=False))
    out = take(s.outbox)[0]
    assert (out.request_id, out.type) == (rid, "result"), out


# UTF-8 safety ---------------------------------------------------------------------------------------


def test_every_split_of_multibyte_characters_streams_the_exact_text() -> None:
    compact = list("é世🎉".encode())  # 2-, 3- and 4-byte characters, every one of its 256 splits
    for text_ids, chunking in [(compact, splits(compact)), (BYTES, splits(BYTES, max_cuts=2))]:
        expected = bytes(text_ids).decode("utf-8")
        for chunks in chunking:
            stream = TextStream()
            parts = []
            for chunk in chunks:
                stream.push(chunk, EOS)
                parts.append(stream.delta(Bytes(), final=False))
            parts.append(stream.delta(Bytes(), final=True))
            assert "".join(parts) == expected, chunks
            assert not any("\ufffd" in part for part in parts), chunks


def test_scheduler_deltas_never_split_a_character() -> None:
    requests = {f"r{i}": chunks for i, chunks in enumerate(splits(BYTES, max_cuts=2))}
    with running(detokenizer()) as s:
        messages: list[IncomingMessage] = []
        for rid, chunks in requests.items():
            messages += [tokens(rid, n, chunk) for n, chunk in enumerate(chunks)]
            messages += [done(rid), payload(rid)]
        put_atomically(s.inbox, messages)
        outputs: dict[str, list[OutgoingMessage]] = {rid: [] for rid in requests}
        finished = 0
        while finished < len(requests):
            out = s.outbox.get(timeout=TIMEOUT)
            outputs[out.request_id].append(out)
            finished += out.type in ("result", "error")
    for rid, outs in outputs.items():
        assert outs[-1].type == "result", (rid, outs[-1])
        assert "".join(deltas(outs)) == TEXT == outs[-1].data.data["text"], requests[rid]
        assert not any("\ufffd" in d for d in deltas(outs)), requests[rid]


def test_one_byte_per_chunk_emits_each_character_once_complete() -> None:
    with running(detokenizer()) as s:
        put_atomically(s.inbox, [payload("r"), *(tokens("r", n, b) for n, b in enumerate(BYTES)), done("r")])
        outputs = until_final(s, "r")
    assert deltas(outputs) == list(TEXT)


def test_invalid_bytes_are_flushed_at_the_end_rather_than_lost() -> None:
    with running(detokenizer()) as s:
        put_atomically(s.inbox, [tokens("r", 0, [104]), tokens("r", 1, [0xE4, 0xB8]), done("r"), payload("r")])
        outputs = until_final(s, "r")
    assert deltas(outputs) == ["h", "\ufffd"]
    assert outputs[-1].data.data == {"text": "h\ufffd"}


# Token formats, eos, payload paths ------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [104, [104, 105], {"token_ids": [104, 105]}, torch.tensor([104, 105]), torch.tensor(104), (104,)],
    ids=["int", "list", "dict", "tensor", "scalar-tensor", "tuple"],
)
def test_chunk_data_formats_carry_token_ids(data: Any) -> None:
    assert token_ids_of(data)[0] == 104


@pytest.mark.parametrize("data", ["hi", True, [1, "x"], {"ids": [1]}, 1.5])
def test_bad_token_data_is_rejected_naming_it(data: Any) -> None:
    with pytest.raises(TypeError, match="token ids must be"):
        token_ids_of(data)


def test_eos_is_not_emitted_and_stops_the_text() -> None:
    with running(detokenizer()) as s:
        put_atomically(
            s.inbox,
            [payload("r"), tokens("r", 0, [104]), tokens("r", 1, [105, EOS, 120]), tokens("r", 2, 121), done("r")],
        )
        outputs = until_final(s, "r")
    assert deltas(outputs) == ["h", "i"]
    assert outputs[-1].data.data == {"text": "hi"}


def test_non_streaming_payload_is_decoded_from_output_token_ids() -> None:
    with running(detokenizer()) as s:
        s.inbox.put(payload("r", {"output_token_ids": [*BYTES, EOS]}, stream=False))
        outputs = until_final(s, "r")
    assert [o.type for o in outputs] == ["result"]
    assert outputs[0].data.data == {"text": TEXT}


def test_non_streaming_payload_without_token_ids_fails_naming_the_field() -> None:
    with running(detokenizer(stage_name="detok")) as s:
        s.inbox.put(payload("r", {"text": "?"}, stream=False))
        (out,) = take(s.outbox)
    assert out.type == "error"
    assert "detok" in str(out.data) and "output_token_ids" in str(out.data)


def test_streaming_request_without_chunks_emits_the_payload_text_once() -> None:
    with running(detokenizer()) as s:
        put_atomically(s.inbox, [done("r"), payload("r", {"output_token_ids": [104, 105, EOS]})])
        outputs = until_final(s, "r")
    assert deltas(outputs) == ["hi"]
    assert outputs[-1].data.data == {"text": "hi"}


def test_done_before_payload_completes_when_the_payload_arrives() -> None:
    with running(detokenizer()) as s:
        put_atomically(s.inbox, [tokens("r", 0, [104]), tokens("r", 1, [0xC3]), done("r")])
        assert take(s.outbox)[0].data == "h"
        s.inbox.put(payload("r", stream=False))  # chunks came first: it streams whatever params say
        outputs = until_final(s, "r")
    assert deltas(outputs) == ["\ufffd"]
    assert outputs[-1].type == "result"


def test_build_result_shapes_the_result_data() -> None:
    def build(p: StagePayload, text: str) -> dict[str, Any]:
        return {"text": text.upper(), "finish_reason": p.data["finish_reason"]}

    with running(detokenizer(build_result=build)) as s:
        s.inbox.put(payload("r", {"output_token_ids": [104, 105], "finish_reason": "stop"}, stream=False))
        (out,) = take(s.outbox)
    assert out.data.data == {"text": "HI", "finish_reason": "stop"}


# Isolation and late input -----------------------------------------------------------------------


def test_bad_chunk_fails_only_its_request() -> None:
    with running(detokenizer(stage_name="detok")) as s:
        put_atomically(s.inbox, [tokens("bad", 0, "oops"), tokens("good", 0, [104])])
        error, delta = take(s.outbox, 2)
        assert (error.request_id, error.type) == ("bad", "error")
        assert "detok" in str(error.data) and "chunk 0" in str(error.data)
        assert (delta.request_id, delta.data) == ("good", "h")
        put_atomically(s.inbox, [tokens("bad", 1, [105]), done("bad"), done("good"), payload("good")])
        assert until_final(s, "good")[-1].data.data == {"text": "h"}
        fence(s)
        assert s.active_streams == 0
    assert s.outbox.empty()


def test_late_chunk_after_abort_or_completion_creates_no_state() -> None:
    with running(detokenizer()) as s:
        put_atomically(s.inbox, [tokens("a", 0, [104]), tokens("c", 0, [104]), done("c"), payload("c")])
        assert [o.type for o in take(s.outbox, 3)] == ["stream", "stream", "result"]
        s.abort("a")
        put_atomically(s.inbox, [tokens("a", 1, [105]), tokens("c", 1, [105])])
        fence(s)
        assert s.active_streams == 0
    assert s.outbox.empty()


# The AR helper's tokenizers ---------------------------------------------------------------------------


@pytest.mark.parametrize("tokenizer", [load_tokenizer(), ByteTokenizer()], ids=["bpe", "bytes"])
def test_ar_token_stream_detokenizes_to_the_text(tokenizer: Any) -> None:
    text = "The vocoder says: héllo, 世界! 🎉 Numbers 100 1000."
    ids = tokenizer.encode(text)
    with running(StreamingDetokenizeScheduler(tokenizer, tokenizer.eos_token_id)) as s:
        chunks = [tokens("r", n, {"token_ids": [i]}) for n, i in enumerate([*ids, tokenizer.eos_token_id])]
        put_atomically(s.inbox, [*chunks, done("r"), payload("r")])
        outputs = until_final(s, "r")
    assert "".join(deltas(outputs)) == text == outputs[-1].data.data["text"]
    assert not any("\ufffd" in d for d in deltas(outputs))
