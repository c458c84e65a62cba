"""configs/qwen3-omni.toml served over HTTP, as OpenAI serves audio chat, to the official ``openai`` client.

Greedy thinker and talker on a tiny checkpoint: the whole answer's ``message.audio`` (a WAV and its
transcript) and the streamed ``delta.audio`` chunks (pcm16 and transcript deltas) equal transformers'
``generate`` on the same checkpoint, and so does the answer in a second speaker's voice (named as the
checkpoint spells it); a voice the checkpoint does not have and a video part are 400s;
``modalities: ["text"]`` answers text only; ``/v1/models`` names the checkpoint directory.
"""

from __future__ import annotations

import base64
import io
import wave
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import torch
import trio

from omnitrio import open_pipeline
from omnitrio.config_loading import load
from omnitrio.serve import serve
from schedulers.qwen3_omni.tiny import SPEAKERS, write_checkpoint
from tests.test_qwen3_omni_pipeline import CONFIG, DEVICE, TALKER_TOKENS, THINKER_TOKENS, reference_answer
from toys.qwen3_omni_reference import ReferenceOutput, load_reference_model, reference_processor, sample_messages
from toys.qwen3_omni_requests import on_pcm_grid, openai_messages, pcm16, snr_db

pytestmark = pytest.mark.timeout(300)

MIN_SNR_DB = 80.0 if DEVICE == "cpu" else 60.0  # pcm16 against generate's (test_qwen3_omni_pipeline says why)
MODEL = "tiny-omni"  # the checkpoint directory's name: the model id


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return write_checkpoint(tmp_path_factory.mktemp("qwen3-omni") / MODEL, size="tiny")


@pytest.fixture(scope="module")
def tone() -> list[dict[str, Any]]:
    return on_pcm_grid(sample_messages()["tone"])


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> tuple[Any, Any]:
    """transformers' model and processor on the checkpoint."""
    return load_reference_model(checkpoint), reference_processor(checkpoint)


@pytest.fixture(scope="module")
def expected(reference: tuple[Any, Any], tone: list[dict[str, Any]]) -> tuple[ReferenceOutput, str]:
    model, processor = reference
    out = reference_answer(model, processor, tone)
    return out, processor.tokenizer.decode(out.token_ids, skip_special_tokens=True)


@pytest.fixture(scope="module")
def chelsie(reference: tuple[Any, Any], tone: list[dict[str, Any]]) -> ReferenceOutput:
    """``generate``'s answer to the tone in the checkpoint's second speaker's voice."""
    model, processor = reference
    return reference_answer(model, processor, tone, speaker="chelsie")


@pytest.fixture
async def url(checkpoint: Path) -> AsyncIterator[str]:
    greedy = ["talker.factory.do_sample=false", f"talker.factory.max_new_tokens={TALKER_TOKENS}"]
    config = load(CONFIG, [*greedy, "talker.factory.min_new_tokens=2"], model=checkpoint, device=DEVICE)
    shutdown = trio.Event()
    async with open_pipeline(config, inline=True) as pipeline, trio.open_nursery() as nursery:
        options = {"port": 0, "handle_signals": False, "graceful_timeout": 0.5, "shutdown": shutdown}
        port = await nursery.start(partial(serve, pipeline, **options))
        yield f"http://127.0.0.1:{port}/v1"
        shutdown.set()


async def call(url: str, fn: Callable[[openai.OpenAI], Any]) -> Any:
    def run() -> Any:
        with openai.OpenAI(base_url=url, api_key="unused", max_retries=0) as client:
            return fn(client)

    return await trio.to_thread.run_sync(run)


def audio_chat(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": openai_messages(messages),
        "modalities": ["text", "audio"],
        "audio": {"voice": "ethan", "format": "wav"},
        "max_tokens": THINKER_TOKENS,
        "temperature": 0,
        **fields,
    }


def wav_samples(data: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(data)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (24_000, 1, 2)
        return np.frombuffer(wav.readframes(wav.getnframes()), "<i2")


def assert_speaks(pcm: np.ndarray, reference: ReferenceOutput) -> None:
    assert reference.waveform is not None
    expected = pcm16(reference.waveform)
    assert len(pcm) == len(expected) and snr_db(expected, pcm) >= MIN_SNR_DB


async def test_whole_audio_answer_is_generates_wav_and_transcript(url: str, tone: Any, expected: Any) -> None:
    reference, transcript = expected
    completion = await call(url, lambda c: c.chat.completions.create(**audio_chat(tone)))
    message = completion.choices[0].message
    assert message.content is None and message.audio.transcript == transcript
    assert_speaks(wav_samples(base64.b64decode(message.audio.data)), reference)
    assert completion.usage.completion_tokens == len(reference.token_ids)


async def test_streamed_audio_answer_is_generates_pcm16_and_transcript_in_decode_order(
    url: str, tone: Any, expected: Any
) -> None:
    reference, transcript = expected
    body = audio_chat(tone, stream=True, audio={"voice": "alloy", "format": "pcm16"})  # OpenAI's: the default
    chunks = await call(url, lambda c: list(c.chat.completions.create(**body)))
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices and chunk.choices[0].delta.audio]
    audio = [delta.audio.model_dump() for delta in deltas]  # the SDK's ChoiceDeltaAudio keeps the extra fields
    pcm = b"".join(base64.b64decode(a["data"]) for a in audio if a.get("data"))
    assert "".join(a.get("transcript") or "" for a in audio) == transcript
    assert sum(1 for a in audio if a.get("data")) > 1  # the speech streams in several chunks
    assert_speaks(np.frombuffer(pcm, "<i2"), reference)


async def test_a_voice_the_checkpoint_lacks_is_a_400_listing_its_speakers(url: str, tone: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await call(
            url, lambda c: c.chat.completions.create(**audio_chat(tone, audio={"voice": "robot", "format": "wav"}))
        )
    assert "'robot'" in caught.value.message and all(name in caught.value.message for name in SPEAKERS)


async def test_a_checkpoint_speaker_is_a_voice(url: str, tone: Any, expected: Any, chelsie: ReferenceOutput) -> None:
    body = audio_chat(tone, audio={"voice": "Chelsie", "format": "wav"})
    completion = await call(url, lambda c: c.chat.completions.create(**body))
    assert_speaks(wav_samples(base64.b64decode(completion.choices[0].message.audio.data)), chelsie)
    ethan, _ = expected
    assert chelsie.waveform is not None and ethan.waveform is not None
    assert not np.array_equal(pcm16(chelsie.waveform), pcm16(ethan.waveform))  # the voice is not the default's


async def test_a_video_part_is_a_400(url: str) -> None:
    video = {"type": "input_video", "input_video": {"data": "AAAA", "format": "mp4"}}
    body = {**audio_chat([]), "messages": [{"role": "user", "content": [video, {"type": "text", "text": "What?"}]}]}
    with pytest.raises(openai.BadRequestError) as caught:
        await call(url, lambda c: c.chat.completions.create(**body))
    assert "video" in caught.value.message


async def test_text_only_modalities_answer_text_without_audio(url: str, tone: Any, expected: Any) -> None:
    _, transcript = expected
    body = {**audio_chat(tone), "modalities": ["text"]}
    del body["audio"]
    completion = await call(url, lambda c: c.chat.completions.create(**body))
    message = completion.choices[0].message
    assert message.content == transcript and message.audio is None


async def test_models_lists_the_checkpoint_by_its_directory_name(url: str) -> None:
    models = await call(url, lambda c: c.models.list())
    assert models.data[0].id == MODEL
