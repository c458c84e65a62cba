"""The omni-tiny pipeline (configs/omni-tiny.toml): routing by media and modalities, text and audio
streamed end to end, through the Python API and through ``/v1/chat/completions``."""

from __future__ import annotations

import base64
import io
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import torch
import trio

from omnitrio import CompleteMessage, OmniRequest, RequestFailed, StagePayload, StreamMessage, open_pipeline
from omnitrio.config import validate
from omnitrio.config_loading import from_dict, load
from omnitrio.errors import ConfigError
from omnitrio.pipeline import Pipeline
from omnitrio.serve.audio import encode_wav
from schedulers.omni.inputs import AUDIO_RATE, parse_chat
from schedulers.omni.responder import create_thinker_responder
from tests.fake_pipeline import Served, start_server

torch.set_num_threads(1)

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
SAMPLES_PER_TOKEN = 4 * 256  # talker frames per token x vocoder hop
MAX_TOKENS = 8

pytestmark = pytest.mark.timeout(600)  # builds and runs omni-tiny: past the global 120 s when busy


def chat(content: Any, modalities: list[str] | None = None) -> dict[str, Any]:
    return {
        "task": "chat",
        "messages": [{"role": "user", "content": content}],
        "modalities": modalities or ["text"],
        "max_tokens": MAX_TOKENS,
    }


def wav_b64(seconds: float, rate: int = 16_000) -> str:
    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.3 * np.sin(2 * np.pi * 330 * t) * 32767).astype(np.int16)
    return base64.b64encode(encode_wav(pcm.tobytes(), rate)).decode()


def png_data_url() -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.arange(48 * 40 * 3, dtype=np.uint8).reshape(40, 48, 3)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


@pytest.fixture
async def pipeline() -> AsyncIterator[Pipeline]:
    async with open_pipeline(load(CONFIGS / "omni-tiny.toml"), inline=True) as running:
        yield running


async def collect(pipeline: Pipeline, rid: str, inputs: Any) -> tuple[list[StreamMessage], dict[str, Any]]:
    chunks: list[StreamMessage] = []
    results: dict[str, Any] = {}
    async with pipeline.stream(rid, inputs) as messages:
        async for message in messages:
            match message:
                case StreamMessage():
                    chunks.append(message)
                case CompleteMessage(from_stage=stage, result=result):
                    results[stage] = result
    return chunks, results


# -- the Python API --------------------------------------------------------------------------------


async def test_text_only_chat_completes_at_the_detokenizer_without_audio(pipeline: Pipeline) -> None:
    chunks, results = await collect(pipeline, "t", chat("hello there"))
    assert set(results) == {"detokenize"}
    assert {c.modality for c in chunks} == {"text"}
    assert results["detokenize"]["usage"]["completion_tokens"] == MAX_TOKENS


async def test_audio_chat_streams_text_deltas_and_audio_that_voices_every_token(pipeline: Pipeline) -> None:
    chunks, results = await collect(pipeline, "a", chat("hello there", ["text", "audio"]))
    assert set(results) == {"detokenize", "code2wav"}
    text = "".join(c.chunk for c in chunks if c.modality == "text")
    assert text == results["detokenize"]["text"] == results["code2wav"]["transcript"]
    audio = [c.chunk for c in chunks if c.modality == "audio"]
    assert len(audio) > 1 and all(a["sample_rate"] == 24_000 and a["pcm"].dtype == np.int16 for a in audio)
    assert sum(len(a["pcm"]) for a in audio) == MAX_TOKENS * SAMPLES_PER_TOKEN == results["code2wav"]["num_samples"]


async def test_audio_and_image_parts_reach_the_thinker_through_their_encoders(pipeline: Pipeline) -> None:
    _, plain = await collect(pipeline, "p", chat([{"type": "text", "text": "what is this"}]))
    media = [
        {"type": "text", "text": "what is this"},
        {"type": "input_audio", "input_audio": {"data": wav_b64(1.0), "format": "wav"}},
        {"type": "image_url", "image_url": {"url": png_data_url()}},
    ]
    _, both = await collect(pipeline, "m", chat(media))
    _, audio_only = await collect(pipeline, "o", chat(media[:2]))
    prompt = plain["detokenize"]["usage"]["prompt_tokens"]
    # 1 s of audio: 101 mel frames (10 ms hop, centred), 4x downsampled → 26 tokens; a 32x32 image: 16 patches.
    assert both["detokenize"]["usage"]["prompt_tokens"] == prompt + 26 + 16
    assert audio_only["detokenize"]["usage"]["prompt_tokens"] == prompt + 26
    assert both["detokenize"]["text"] != plain["detokenize"]["text"]


async def test_a_remote_image_url_fails_the_request_naming_the_part(pipeline: Pipeline) -> None:
    part = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    with pytest.raises(RequestFailed, match=r"messages\[0\]\.content\[0\]\.image_url\.url: only data: URLs"):
        await pipeline.submit("bad", chat([part]))


def test_raw_pcm16_input_is_resampled_from_24_to_16_khz() -> None:
    pcm = np.zeros(24_000, np.int16).tobytes()
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(pcm).decode(), "format": "pcm16"}}
    (clip,) = parse_chat(chat([part])).audio
    assert clip.dtype == np.float32 and len(clip) == AUDIO_RATE


# -- HTTP ------------------------------------------------------------------------------------------


@pytest.fixture
async def served(nursery: trio.Nursery, pipeline: Pipeline) -> Served:
    return await start_server(nursery, pipeline)  # type: ignore[arg-type]


def audio_request(stream: bool) -> dict[str, Any]:
    return {
        "model": "omni-tiny",
        "messages": [{"role": "user", "content": "say something"}],
        "modalities": ["text", "audio"],
        "audio": {"voice": "alloy", "format": "pcm16"},
        "max_tokens": MAX_TOKENS,
        "stream": stream,
    }


async def test_openai_client_streams_text_and_pcm16_audio_at_24khz(served: Served) -> None:
    def run() -> list[Any]:
        with openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0) as client:
            return list(client.chat.completions.create(**audio_request(stream=True)))

    chunks = await trio.to_thread.run_sync(run)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    text = "".join(d.content or "" for d in deltas)
    audio = [d.audio for d in deltas if d.audio]
    pcm = b"".join(base64.b64decode(a.data) for a in audio if a.data)
    transcript = "".join(a.transcript or "" for a in audio)
    assert text and text == transcript
    assert len(pcm) == 2 * MAX_TOKENS * SAMPLES_PER_TOKEN  # PCM16 mono: 24 kHz in, 24 kHz out
    samples = np.frombuffer(pcm, "<i2")
    assert np.abs(samples).max() > 0
    assert chunks[-1].choices[0].finish_reason == "length"  # random weights never end a turn: cut at max tokens


async def test_sse_delivers_text_and_audio_deltas_as_they_are_produced(served: Served) -> None:
    events: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        async with client.stream("POST", "/v1/chat/completions", json=audio_request(stream=True)) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    kinds = []
    for event in events:
        delta = event["choices"][0]["delta"] if event["choices"] else {}
        if delta.get("content"):
            kinds.append("text")
        if (delta.get("audio") or {}).get("data"):
            kinds.append("audio")
    # Text is detokenized while the thinker generates; audio follows once the talker voices it.
    assert kinds.count("text") > 1 and kinds.count("audio") > 1
    assert kinds.index("text") < kinds.index("audio")


async def test_whole_answer_carries_text_and_a_wav_of_the_spoken_transcript(served: Served) -> None:
    body = {**audio_request(stream=False), "audio": {"voice": "alloy", "format": "wav"}}
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        response = await client.post("/v1/chat/completions", json=body)
    message = response.json()["choices"][0]["message"]
    import soundfile

    samples, rate = soundfile.read(io.BytesIO(base64.b64decode(message["audio"]["data"])), dtype="int16")
    assert rate == 24_000 and len(samples) == MAX_TOKENS * SAMPLES_PER_TOKEN
    assert message["content"] == message["audio"]["transcript"]
    assert response.json()["usage"]["completion_tokens"] == MAX_TOKENS


# -- the thinker as the voice loop's responder ---------------------------------------------------------


def run_responder(data: Any, inputs: Any) -> Any:
    responder = create_thinker_responder(dim=64, n_layers=1, max_new_tokens=6)
    thread = threading.Thread(target=responder.start)
    thread.start()
    try:
        from omnitrio.contract import IncomingMessage

        responder.inbox.put(IncomingMessage("r", "new_request", StagePayload("r", OmniRequest(inputs), data)))
        return responder.outbox.get(timeout=10)
    finally:
        responder.stop()
        thread.join(timeout=10)


def test_responder_answers_raw_chat_inputs() -> None:
    inputs = chat("hello")
    out = run_responder({"raw_inputs": inputs}, inputs)
    assert out.type == "result" and out.data.data["finish_reason"] == "length"


def test_a_misspelt_responder_argument_is_refused_when_the_config_is_read() -> None:
    stage = {"name": "responder", "factory_path": "schedulers.omni.responder.create_thinker_responder"}
    with pytest.raises(ConfigError, match=r"'responder'.*does not accept \['dimm'\]; it accepts \['dim', "):
        validate(from_dict({"stages": [{**stage, "factory": {"dimm": 64}, "terminal": True}]}))


def test_realtime_llm_config_keeps_the_speech_graph_and_swaps_the_responder() -> None:
    pytest.importorskip("piper", reason="the speech extra is not installed")
    speech, llm = load(CONFIGS / "speech.toml"), load(CONFIGS / "realtime-llm.toml")
    assert [s.name for s in llm.stages] == [s.name for s in speech.stages]
    assert llm.stage("responder").factory_path == "schedulers.omni.responder.create_thinker_responder"


def test_qwen3_omni_gpu_config_validates_without_importing_sglang() -> None:
    import sys

    config = load(CONFIGS / "qwen3-omni-sglang.toml")
    assert config.stage("thinker").factory_path == "schedulers.ar.sglang_backend.create_sglang_scheduler"
    assert "sglang" not in sys.modules


async def test_speech_and_transcription_are_404_naming_the_chat_route(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        speech = await client.post("/v1/audio/speech", json={"input": "hello", "voice": "alloy"})
        transcription = await client.post("/v1/audio/transcriptions", files={"file": ("a.wav", b"RIFF")})
        models = await client.get("/v1/models")
    for response in (speech, transcription):
        assert response.status_code == 404
        assert "'omni-tiny' does not serve" in response.json()["error"]["message"]
        assert "it serves POST /v1/chat/completions" in response.json()["error"]["message"]
    assert models.json()["data"][0]["serves"] == ["POST /v1/chat/completions"]
