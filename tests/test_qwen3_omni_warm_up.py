"""configs/qwen3-omni.toml pays at start-up what a first request of each kind would pay in its front and its
listener: when it says ready, preprocess has run the processor on a text, an audio and an image chat, each
encoder its tower, stream_asr its recognizer's decodes, voice activity detector and turn model, the thinker and the
talker a request of each input kind alone and a batch, code2wav first windows alone and batched (the start-up
events say so, before the pipeline's ready), with one process per group as the config places them (two for
code2wav); and each process that sends tensors holds its shared-memory pool already, so no first request creates one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from omnitrio import open_pipeline
from omnitrio.config_loading import load
from omnitrio.events import EVENT_DIR_ENV
from tests.startup_helpers import tiny_qwen3_omni, warmed_before_ready

__all__ = ["tiny_qwen3_omni"]

pytestmark = pytest.mark.timeout(600)

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "qwen3-omni.toml"
DECODES = ["transcribe", "transcribe quick"]
WARMED = {
    "preprocess": ["text", "audio", "image"],
    "audio_encoder": ["audio"],
    "image_encoder": ["image"],
    "asr": DECODES,
    "stream_asr": [*DECODES, "resample", "voice activity", "turn model"],
    "thinker": ["text", "audio", "image", "batch"],
    "talker": ["text", "audio", "image", "batch"],
    "code2wav": ["first window", "windows", "batch"],
}


async def test_qwen3_omni_is_warm_when_it_says_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_qwen3_omni: Path
) -> None:
    monkeypatch.setenv(EVENT_DIR_ENV, str(tmp_path))
    async with open_pipeline(load(CONFIG, model=tiny_qwen3_omni)):
        ours = f"omnitrio-{os.getpid()}-"
        pools = {name for name in os.listdir("/dev/shm") if name.startswith(ours) and name.endswith("-pool")}
    warmed = warmed_before_ready(tmp_path)
    assert {stage: warmed[stage] for stage in WARMED} == WARMED
    senders = ["main", "frontend", "thinker", "talker", "code2wav.0", "code2wav.1"]  # code2wav's two copies
    assert {p: any(f"-{p}-" in name for name in pools) for p in senders} == dict.fromkeys(senders, True)
