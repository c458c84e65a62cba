"""``python -m omnitrio tiny-model``: a random checkpoint a shipped config serves, written by one command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from omnitrio.cli import main
from omnitrio.tiny_models import TINY_MODELS, config_for
from schedulers.qwen3_omni.tiny import write_checkpoint

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(300)


def test_the_command_writes_a_checkpoint_its_config_checks_and_says_how_to_serve_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "q3"
    done = subprocess.run(
        [sys.executable, "-m", "omnitrio", "tiny-model", "qwen3-omni", str(target), "--seed", "3"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    config = ROOT / "configs" / "qwen3-omni.toml"
    assert f"serve it: python -m omnitrio serve --config {config} --model {target}" in done.stdout
    assert config_for("qwen3-omni") == config
    assert main(["check", "--model", str(target), str(config)]) == 0
    capsys.readouterr()

    again = write_checkpoint(tmp_path / "again", seed=3)
    shards = sorted(p.name for p in target.glob("*.safetensors"))
    assert len(shards) >= 2 and shards == sorted(p.name for p in again.glob("*.safetensors"))
    for name in (*shards, "config.json", "model.safetensors.index.json", "tokenizer.json"):
        assert (target / name).read_bytes() == (again / name).read_bytes(), name


def test_an_unknown_family_is_a_usage_error_naming_the_families(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["tiny-model", "qwen9-omni", "/nonexistent/never-written"])
    assert caught.value.code == 2
    assert all(family in capsys.readouterr().err for family in TINY_MODELS)
    assert not Path("/nonexistent/never-written").exists()
