"""configs/qwen3-omni.toml pays at start-up what a first request of each kind would pay in its front and its
listener: when it says ready, preprocess has run the processor on a text, an audio and an image chat, each
encoder its tower, and stream_asr its recognizer's decodes, voice activity detector and turn model (the start-up
events say so, before the pipeline's ready), with one process per group as the config places them."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from omnitrio import open_pipeline  # noqa: E402
from omnitrio.config_loading import load  # noqa: E402
from omnitrio.events import EVENT_DIR_ENV, FILE_PATTERN, PIPELINE_READY, STAGE_WARM, Event  # noqa: E402
from schedulers.qwen3_omni.tiny import write_checkpoint  # noqa: E402

pytestmark = pytest.mark.timeout(600)

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "qwen3-omni.toml"
DECODES = ["transcribe", "transcribe quick", "transcribe timed"]
WARMED = {
    "preprocess": ["text", "audio", "image"],
    "audio_encoder": ["audio"],
    "image_encoder": ["image"],
    "asr": DECODES,
    "stream_asr": [*DECODES, "resample", "voice activity", "turn model"],
}


async def test_qwen3_omni_is_warm_when_it_says_ready(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    checkpoint = write_checkpoint(tmp_path / "tiny", size="tiny")
    events_dir = tmp_path / "events"
    monkeypatch.setenv(EVENT_DIR_ENV, str(events_dir))
    async with open_pipeline(load(CONFIG, model=checkpoint)):
        pass
    decoder = msgspec.json.Decoder(Event)
    found = [decoder.decode(line) for path in events_dir.glob(FILE_PATTERN) for line in path.read_bytes().splitlines()]
    (ready,) = [e.t_ns for e in found if e.event == PIPELINE_READY]
    warm = {e.stage: e for e in found if e.event == STAGE_WARM}
    assert {stage: warm[stage].fields["warmed"] for stage in WARMED} == WARMED
    assert all(e.t_ns < ready for e in warm.values())
