"""The default pipeline (configs/speech.toml) pays at start-up what a first request of each kind would pay:
when it says ready, every model stage has warmed each way a request uses it (the start-up events say
which, before the pipeline's ready), and the models a first realtime session would load lazily (the
voice activity detector's, the turn model) are loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omnitrio.events import EVENT_DIR_ENV
from tests.startup_helpers import warmed_before_ready

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
DECODES = ["transcribe", "transcribe quick"]
WARMED = {
    "asr": DECODES,
    "stream_asr": [*DECODES, "resample", "voice activity", "turn model"],
    "responder": ["chat", "spoken chat"],
    "tts": ["synthesize"],
}
START = """
import json, sys, trio
from omnitrio import open_pipeline
from omnitrio.config_loading import load

async def main():
    async with open_pipeline(load(sys.argv[1])):
        from schedulers.speech import turn_model, vad
        silero, turn = vad._silero_model.cache_info(), turn_model._shared.cache_info()
        print(json.dumps({"voice activity": silero.currsize, "turn": turn.currsize}))

trio.run(main)
"""


def test_the_default_pipeline_is_warm_when_it_says_ready(tmp_path: Path) -> None:
    env = {**os.environ, EVENT_DIR_ENV: str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", START, str(ROOT / "configs" / "speech.toml")],
        env=env, cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(done.stdout.splitlines()[-1]) == {"voice activity": 1, "turn": 1}
    warmed = warmed_before_ready(tmp_path)
    assert {stage: warmed[stage] for stage in WARMED} == WARMED
