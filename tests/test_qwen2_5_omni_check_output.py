"""What a user sees when checking or starting Qwen2.5-Omni: transformers' token check on the talker's
thinker-vocabulary ids (known-harmless: they index the thinker's embedding, not the codec vocabulary) is
silenced, while the same check on an id that really is out of its vocabulary still reaches the user."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.qwen2_5_omni_reference import tiny_checkpoint  # noqa: F401  (fixture)

TOKEN_CHECK = "Model config:"


def check_output(model: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "omnitrio", "check", "--model", str(model)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_checking_prints_no_known_harmless_token_warning(tiny: Path) -> None:
    assert TOKEN_CHECK not in check_output(tiny)


def test_a_real_warning_of_the_same_check_still_reaches_the_user(tiny: Path, tmp_path: Path) -> None:
    model = tmp_path / "odd"
    shutil.copytree(tiny, model)
    config = json.loads((model / "config.json").read_text())
    config["thinker_config"]["text_config"]["pad_token_id"] = 99_999
    (model / "config.json").write_text(json.dumps(config))
    warned = [line for line in check_output(model).splitlines() if TOKEN_CHECK in line]
    assert warned and all("pad_token_id" in line and "99999" in line for line in warned), warned
