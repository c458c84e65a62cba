"""``--model PATH`` without ``--config`` picks the pipeline from what PATH is (``serve`` and ``check``).

A checkpoint directory gets its family's shipped config by ``config.json``'s ``model_type``, a ``.gguf``
file the default pipeline; anything else is an error at start naming what was found and what is served.
``check`` prints the stage graph before it checks the files, so a directory holding only ``config.json``
shows which pipeline was picked (and the checkpoint's missing files then fail the check).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from omnitrio.cli import DEFAULT_CONFIG, main
from omnitrio.families import FAMILIES, config_for_model

ROOT = Path(__file__).resolve().parent.parent


def checkpoint(tmp_path: Path, model_type: str, name: str = "my-model") -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": model_type}))
    return directory


def picked(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[str, str]:
    """The stage graph ``check`` printed (stdout) and its errors (stderr)."""
    main(["check", *argv])
    captured = capsys.readouterr()
    return captured.out, captured.err


@pytest.mark.parametrize(
    ("model_type", "package"), [("qwen3_omni_moe", "qwen3_omni"), ("qwen2_5_omni", "qwen2_5_omni")]
)
def test_a_checkpoint_directory_gets_its_familys_pipeline_named_after_the_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model_type: str, package: str
) -> None:
    model = checkpoint(tmp_path, model_type, "Omni-7B")
    out, _ = picked(capsys, "--model", str(model))
    assert out.startswith("pipeline 'Omni-7B':")  # /v1/models names the pipeline
    assert f"schedulers.{package}.front.preprocess.create_preprocess_stage" in out
    assert all(f"schedulers.{other}." not in out for other in {"qwen3_omni", "qwen2_5_omni"} - {package})


def test_every_family_is_served_by_a_shipped_config(tmp_path: Path) -> None:
    for family in FAMILIES.values():
        model = checkpoint(tmp_path, family.model_type, family.model_type)
        assert config_for_model(model) == ROOT / "configs" / family.config
        assert (ROOT / "configs" / family.config).is_file()


def test_a_gguf_file_gets_the_default_pipelines_responder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gguf = tmp_path / "other.gguf"
    out, err = picked(capsys, "--model", str(gguf))
    assert out.startswith("pipeline 'omnitrio-speech':")
    assert f"stage 'responder': {gguf}: no such file" in err


def test_config_given_with_model_wins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = checkpoint(tmp_path, "qwen3_omni_moe")
    out, err = picked(capsys, "--model", str(model), str(DEFAULT_CONFIG))
    assert out.startswith("pipeline 'omnitrio-speech':")
    assert f"stage 'responder': {model}" in err


def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"")
    return path


NOT_SERVED = {
    "unknown-model-type": (lambda tmp: checkpoint(tmp, "llama"), "model_type 'llama' is not served here"),
    "no-config": (lambda tmp: tmp, "no config.json"),
    "missing": (lambda tmp: tmp / "missing", "does not exist"),
    "a-file": (a_file, "is not a directory"),
}


@pytest.mark.parametrize("case", sorted(NOT_SERVED))
def test_anything_else_is_a_config_error_naming_what_is_served(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    make, said = NOT_SERVED[case]
    assert main(["check", "--model", str(make(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert said in err
    assert all(family.model_type in err for family in FAMILIES.values()) and ".gguf" in err


@pytest.mark.timeout(120)
def test_serve_of_an_unserved_model_type_exits_2_at_start_naming_it(tmp_path: Path) -> None:
    model = checkpoint(tmp_path, "whisper")
    done = subprocess.run(
        [sys.executable, "-m", "omnitrio", "serve", "--port", "0", "--model", str(model)],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("omnitrio: error: ") and "Traceback" not in done.stderr
    assert "model_type 'whisper' is not served here" in done.stderr
    assert "qwen3_omni_moe (qwen3-omni)" in done.stderr and "qwen2_5_omni (qwen2.5-omni)" in done.stderr
