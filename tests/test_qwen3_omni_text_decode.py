"""The Qwen3-Omni text decode stage: the thinker's token chunks → the tokenizer's own text, as content or transcript."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from omnitrio.contract import IncomingMessage, OmniRequest, OutgoingMessage, StagePayload, StreamItem
from omnitrio.messages import CompleteMessage, StreamMessage
from omnitrio.serve.output import Output
from schedulers.engine.handoffs import DecodeToken, ThinkerResult
from schedulers.qwen3_omni.thinker.text_decode import TextDecodeScheduler, create_decode_stage
from schedulers.qwen3_omni.tiny_tokenizer import build_tokenizer
from tests.scheduler_harness import running, take

TEXT = "héllo wörld 🙂 — ok"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def _answer_ids(tokenizer: Any) -> list[int]:
    """An answer whose characters span several byte-level tokens, ending on ``<|im_end|>``."""
    return [*tokenizer.encode(TEXT, add_special_tokens=False), tokenizer.convert_tokens_to_ids("<|im_end|>")]


def _decode(scheduler: TextDecodeScheduler, ids: list[int], want_audio: bool) -> list[OutgoingMessage]:
    """Stream ``ids`` as the thinker does, then its stream end and result; every output up to the result."""
    rid = "r"
    with running(scheduler):
        for i, token in enumerate(ids):
            chunk = DecodeToken(token, want_audio)
            scheduler.inbox.put(IncomingMessage(rid, "stream_chunk", StreamItem(i, chunk, "thinker")))
        scheduler.inbox.put(IncomingMessage(rid, "stream_done", "thinker"))
        data = ThinkerResult(tuple(ids), 7, "stop", want_audio)
        scheduler.inbox.put(IncomingMessage(rid, "new_request", StagePayload(rid, OmniRequest(), data)))
        outputs = []
        while (out := take(scheduler.outbox)[0]).type == "stream":
            outputs.append(out)
        return [*outputs, out]


def test_text_only_answer_streams_the_tokenizers_decode_as_text(model_dir: Path, tokenizer: Any) -> None:
    ids = _answer_ids(tokenizer)
    outputs = _decode(create_decode_stage(model_dir=model_dir), ids, want_audio=False)
    deltas, result = outputs[:-1], outputs[-1]
    expected = tokenizer.decode(ids, skip_special_tokens=True)
    assert expected == TEXT
    assert all(d.metadata == {"modality": "text"} and "\ufffd" not in d.data for d in deltas)
    assert "".join(d.data for d in deltas) == expected
    assert result.type == "result"
    assert result.data.data == {
        "text": expected,
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 7, "completion_tokens": len(ids)},
        "token_ids": ids,
    }


def test_audio_answer_streams_its_words_as_the_transcript(model_dir: Path, tokenizer: Any) -> None:
    ids = _answer_ids(tokenizer)
    outputs = _decode(create_decode_stage(model_dir=model_dir), ids, want_audio=True)
    deltas, result = outputs[:-1], outputs[-1]
    assert deltas and all(d.metadata == {"modality": "transcript"} for d in deltas)
    assert "".join(d.data for d in deltas) == TEXT
    assert result.data.data["transcript"] == TEXT and "text" not in result.data.data


@pytest.mark.parametrize(("want_audio", "content", "transcript"), [(False, TEXT, ""), (True, "", TEXT)])
def test_served_words_land_in_content_or_transcript(
    model_dir: Path, tokenizer: Any, want_audio: bool, content: str, transcript: str
) -> None:
    outputs = _decode(create_decode_stage(model_dir=model_dir), _answer_ids(tokenizer), want_audio=want_audio)
    served = Output(audio_rate=None, want_audio=want_audio)
    for i, out in enumerate(outputs[:-1]):
        served.add(StreamMessage("r", "decode", i, out.data, modality=out.metadata["modality"]))
    served.add(CompleteMessage("r", "decode", outputs[-1].data.data))
    served.finish()
    assert (served.text, served.transcript) == (content, transcript)


def test_payload_without_chunks_decodes_its_token_ids(model_dir: Path, tokenizer: Any) -> None:
    ids = _answer_ids(tokenizer)
    scheduler = create_decode_stage(model_dir=model_dir)
    with running(scheduler):
        data = ThinkerResult(tuple(ids), 7, "length", want_audio=False)
        scheduler.inbox.put(IncomingMessage("r", "new_request", StagePayload("r", OmniRequest(), data)))
        (result,) = take(scheduler.outbox)
    assert result.type == "result" and result.data.data["text"] == TEXT
    assert result.data.data["finish_reason"] == "length"
