"""The HTTP routes as the official ``openai`` client (and curl-like httpx) uses them."""

from __future__ import annotations

import base64
import io
import wave
from collections.abc import Callable
from typing import Any, cast

import httpx
import numpy as np
import openai
import pytest
import soundfile
import trio

from omnitrio.serve.audio import encode_wav, float_to_pcm16
from tests.fake_pipeline import Served, start_server, tone

WORD_SAMPLES_24K = 2400  # the fake speaks 0.1 s of audio per word


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    return await start_server(nursery)


async def call(served: Served, fn: Callable[[Any], Any]) -> Any:
    """Run a sync openai-client call in a thread (the client is httpx-sync)."""

    def run() -> Any:
        with openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0) as client:
            return fn(client)

    return await trio.to_thread.run_sync(run)


def wav_bytes(seconds: float, rate: int = 16_000) -> bytes:
    return encode_wav(float_to_pcm16(tone(seconds, rate, as_float=True)), rate)


async def test_models_lists_the_served_pipeline_first(served: Served) -> None:
    models = await call(served, lambda c: [m.id for m in c.models.list()])
    assert models[0] == "fake-omni"


async def test_chat_completion_returns_the_pipeline_text(served: Served) -> None:
    answer = await call(
        served,
        lambda c: c.chat.completions.create(model="fake-omni", messages=[{"role": "user", "content": "hi there"}]),
    )
    assert answer.choices[0].message.content == "echo: hi there "
    assert answer.usage.total_tokens == 5
    assert served.fake.history[0].inputs["messages"] == [{"role": "user", "content": "hi there"}]


async def test_chat_stream_sends_role_then_text_deltas_then_stop(served: Served) -> None:
    def stream(c: Any) -> list[Any]:
        messages = [{"role": "user", "content": "a b"}]
        return list(c.chat.completions.create(model="fake-omni", messages=messages, stream=True))

    chunks = await call(served, stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == "echo: a b "
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_chat_stream_audio_is_base64_pcm16_at_24khz_with_transcript(served: Served) -> None:
    def stream(c: Any) -> list[Any]:
        return list(
            c.chat.completions.create(
                model="fake-omni",
                messages=[{"role": "user", "content": "say two"}],
                modalities=["text", "audio"],
                audio={"voice": "alloy", "format": "pcm16"},
                stream=True,
            )
        )

    audio = [ch.choices[0].delta.audio for ch in await call(served, stream) if ch.choices[0].delta.audio]
    pcm = b"".join(base64.b64decode(a.data) for a in audio if a.data)
    transcript = "".join(a.transcript or "" for a in audio)
    assert len(pcm) == 3 * WORD_SAMPLES_24K * 2
    assert transcript == "echo: say two "
    assert served.fake.history[0].inputs["audio"] == {"voice": "alloy", "format": "pcm16"}


async def test_chat_whole_audio_answer_is_a_24khz_wav(served: Served) -> None:
    answer = await call(
        served,
        lambda c: c.chat.completions.create(
            model="fake-omni",
            messages=[{"role": "user", "content": "x"}],
            modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "wav"},
        ),
    )
    audio = answer.choices[0].message.audio
    with wave.open(io.BytesIO(base64.b64decode(audio.data))) as wav:
        assert (wav.getframerate(), wav.getnframes(), wav.getsampwidth()) == (24_000, 2 * WORD_SAMPLES_24K, 2)
    assert audio.transcript == "echo: x "


async def test_speech_wav_is_a_complete_file_with_its_real_sizes(served: Served) -> None:
    def speak(c: Any) -> bytes:
        return c.audio.speech.create(model="fake-omni", voice="alloy", input="one two", response_format="wav").content

    data = await call(served, speak)
    with wave.open(io.BytesIO(data)) as wav:
        assert (wav.getframerate(), wav.getnframes()) == (16_000, 3 * 1600)
        assert len(wav.readframes(1 << 20)) == 3 * 1600 * 2
    assert int.from_bytes(data[4:8], "little") == len(data) - 8  # the RIFF size, as soxi and players read it


async def test_speech_pcm_is_raw_pcm16_at_24khz(served: Served) -> None:
    def speak(c: Any) -> bytes:
        return c.audio.speech.create(model="fake-omni", voice="alloy", input="one", response_format="pcm").content

    assert len(await call(served, speak)) == 2 * WORD_SAMPLES_24K * 2


async def test_speech_sse_sends_audio_deltas_then_done(served: Served) -> None:
    body = {"input": "one", "voice": "alloy", "response_format": "pcm", "stream_format": "sse"}
    async with httpx.AsyncClient(base_url=served.url) as client:
        response = await client.post("/v1/audio/speech", json=body)
    events = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    parsed = [httpx.Response(200, content=e).json() for e in events]
    assert [e["type"] for e in parsed][-1] == "speech.audio.done"
    pcm = b"".join(base64.b64decode(e["audio"]) for e in parsed if e["type"] == "speech.audio.delta")
    assert len(pcm) == 2 * WORD_SAMPLES_24K * 2


@pytest.mark.parametrize(
    ("response_format", "expected"),
    [("json", "heard 1.00 seconds "), ("text", "heard 1.00 seconds "), ("verbose_json", "heard 1.00 seconds ")],
)
async def test_transcription_formats_carry_the_text(served: Served, response_format: str, expected: str) -> None:
    def transcribe(c: Any) -> Any:
        return c.audio.transcriptions.create(
            model="fake-omni", file=("a.wav", wav_bytes(1.0)), response_format=response_format
        )

    result = await call(served, transcribe)
    assert (result if isinstance(result, str) else result.text) == expected


async def test_transcription_decodes_and_resamples_a_stereo_flac_to_16khz_mono(served: Served) -> None:
    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros((48_000, 2), np.float32), 48_000, format="FLAC")
    result = await call(
        served, lambda c: c.audio.transcriptions.create(model="fake-omni", file=("a.flac", buffer.getvalue()))
    )
    assert result.text == "heard 1.00 seconds "
    audio = served.fake.history[0].inputs["audio"]
    assert (audio.dtype, audio.shape) == (np.float32, (16_000,))


async def test_transcription_stream_sends_text_deltas_then_done(served: Served) -> None:
    def transcribe(c: Any) -> list[Any]:
        return list(c.audio.transcriptions.create(model="fake-omni", file=("a.wav", wav_bytes(0.5)), stream=True))

    events = await call(served, transcribe)
    assert "".join(e.delta for e in events if e.type == "transcript.text.delta") == "heard 0.50 seconds "
    assert events[-1].type == "transcript.text.done"
    assert events[-1].text == "heard 0.50 seconds "


async def test_health_is_200_when_every_stage_is_alive_and_503_otherwise(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        alive = await client.get("/health")
        served.fake.alive = False
        dead = await client.get("/health")
    assert (alive.status_code, dead.status_code) == (200, 503)
    assert dead.json()["stages"]["fake"]["alive"] is False


async def test_metrics_exposes_the_pipeline_registry(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        metrics = await client.get("/metrics")
    assert "fake_requests_total 1.0" in metrics.text


async def test_overloaded_pipeline_answers_429_even_for_a_stream(served: Served) -> None:
    def create(c: Any) -> Any:
        messages = [{"role": "user", "content": "overload"}]
        return list(c.chat.completions.create(model="fake-omni", messages=messages, stream=True))

    with pytest.raises(openai.RateLimitError) as caught:
        await call(served, create)
    assert caught.value.status_code == 429
    assert caught.value.response.headers["retry-after"] == "1"
    assert cast(dict[str, Any], caught.value.body)["code"] == "overloaded"


async def test_request_timeout_answers_504(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        response = await client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "timeout"}]}
        )
    assert response.status_code == 504
    assert response.json()["error"]["type"] == "server_error"


async def test_stage_failure_mid_stream_ends_with_an_error_event(served: Served) -> None:
    def create(c: Any) -> Any:
        messages = [{"role": "user", "content": "please fail"}]
        return list(c.chat.completions.create(model="fake-omni", messages=messages, stream=True))

    with pytest.raises(openai.APIError, match="fake failure on purpose"):
        await call(served, create)
    assert served.fake.history[0].outcome == "failed"


async def test_stage_failure_without_stream_is_a_500_naming_the_stage(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        response = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "fail"}]})
    assert response.status_code == 500
    assert "stage 'fake' raised ValueError: fake failure on purpose" in response.json()["error"]["message"]


async def test_unknown_model_is_404_model_not_found(served: Served) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await call(
            served, lambda c: c.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
        )
    assert cast(dict[str, Any], caught.value.body)["code"] == "model_not_found"


async def test_upload_over_the_limit_is_413(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        response = await client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav_bytes(40.0))})
    assert response.status_code == 413
    assert "limit" in response.json()["error"]["message"]


async def test_speech_failing_after_audio_started_cuts_the_body_off(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post("/v1/audio/speech", json={"input": "please fail", "response_format": "pcm"})
    assert served.fake.history[0].outcome == "failed"


async def test_text_only_chat_stream_carries_no_audio_fields(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        body = {"messages": [{"role": "user", "content": "x"}], "stream": True}
        response = await client.post("/v1/chat/completions", json=body)
    assert '"audio"' not in response.text
    assert response.text.endswith("data: [DONE]\n\n")
