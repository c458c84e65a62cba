"""``python -m omnitrio tiny-model``: a random checkpoint a shipped config serves, written by one command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from omnitrio.cli import main
from omnitrio.families import FAMILIES, config_for
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
    assert f"serve it: python -m omnitrio serve --model {target}" in done.stdout
    assert config_for("qwen3-omni") == ROOT / "configs" / "qwen3-omni.toml"
    assert main(["check", "--model", str(target)]) == 0
    assert capsys.readouterr().out.startswith("pipeline 'q3':")

    again = write_checkpoint(tmp_path / "again", seed=3)
    shards = sorted(p.name for p in target.glob("*.safetensors"))
    assert len(shards) >= 2 and shards == sorted(p.name for p in again.glob("*.safetensors"))
    for name in (*shards, "config.json", "model.safetensors.index.json", "tokenizer.json"):
        assert (target / name).read_bytes() == (again / name).read_bytes(), name


def test_the_qwen2_5_omni_command_writes_a_checkpoint_its_config_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "q25"
    assert main(["tiny-model", "qwen2.5-omni", str(target)]) == 0
    assert f"serve it: python -m omnitrio serve --model {target}" in capsys.readouterr().out
    assert (target / "spk_dict.pt").is_file()
    assert main(["check", "--model", str(target)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pipeline 'q25':") and "schedulers.qwen2_5_omni.front.preprocess" in out


def test_an_unknown_family_is_a_usage_error_naming_the_families(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["tiny-model", "qwen9-omni", "/nonexistent/never-written"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert all(family in err for family in FAMILIES)
    assert not Path("/nonexistent/never-written").exists()
