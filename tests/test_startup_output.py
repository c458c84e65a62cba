"""What a user sees on the server's stderr while Qwen3-Omni starts: no known-harmless library noise
(transformers' rope check not knowing the keys Qwen3-Omni's rotary embedding reads), while a real
warning of the same check still reaches the user, once per stage process that reads the checkpoint
rather than once per stage."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.startup_helpers import short_tmp, tiny_qwen3_omni
from toys.served import open_server

__all__ = ["short_tmp", "tiny_qwen3_omni"]  # fixtures

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parent.parent
ROPE_CHECK = "Unrecognized keys in `rope_parameters`"
READERS = 5
"""The stage processes of configs/qwen3-omni.toml that read the checkpoint's configuration (code2wav's two
copies count twice)."""


async def start_and_stop(model: Path, short_tmp: Path) -> str:
    serve = ["--config", str(ROOT / "configs" / "qwen3-omni.toml"), "--model", str(model)]
    async with open_server(serve, short_tmp) as served:
        pass
    assert served.process.returncode == 0, served.stderr
    return served.stderr


async def test_starting_qwen3_omni_prints_no_known_harmless_warning(tiny_qwen3_omni: Path, short_tmp: Path) -> None:
    stderr = await start_and_stop(tiny_qwen3_omni, short_tmp)
    assert "omnitrio: pipeline ready" in stderr
    assert ROPE_CHECK not in stderr


async def test_a_real_warning_of_the_same_check_still_reaches_the_user(tiny_qwen3_omni: Path, short_tmp: Path) -> None:
    model = short_tmp / "odd"
    shutil.copytree(tiny_qwen3_omni, model)
    config = json.loads((model / "config.json").read_text())
    config["code2wav_config"]["rope_parameters"]["odd_rope_key"] = 1
    (model / "config.json").write_text(json.dumps(config))
    stderr = await start_and_stop(model, short_tmp)
    warned = [line for line in stderr.splitlines() if ROPE_CHECK in line]
    assert warned and all("odd_rope_key" in line for line in warned), stderr
    assert len(warned) <= READERS, warned
