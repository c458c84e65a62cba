"""``python -m omnitrio run`` as a user reads it: streamed chunks, audio files, start-up failures."""

from __future__ import annotations

import subprocess
import sys
import wave
from pathlib import Path

import pytest

from omnitrio.cli import main
from tests.cli_stages import RATE
from tests.test_cli import ROOT, TOY, one_stage_toml, write

WORDS = """
name = "words"
[[stages]]
name = "split"
factory_path = "examples.words.create_split"
next = ["upper", "count"]
project_payload = { upper = "examples.words.only_text", count = "examples.words.only_words" }
[[stages]]
name = "upper"
factory_path = "examples.words.create_upper"
next = "join"
[[stages]]
name = "count"
factory_path = "examples.words.create_count"
next = "join"
[[stages]]
name = "join"
factory_path = "examples.words.create_join"
terminal = true
wait_for = ["upper", "count"]
merge_fn = "examples.words.merge"
"""
VOICE = one_stage_toml("voice", "tests.cli_stages.create_voice")


def broken(process: str) -> str:
    """:data:`tests.test_cli.TOY` named "broken", its ``tag`` stage's factory raising when built and placed by
    the line ``process``."""
    tag = 'factory_path = "toys.stages.create_tag"\nfactory = { tag = "seen" }'
    assert tag in TOY
    return TOY.replace('name = "toy"', 'name = "broken"').replace(
        tag, f'{process}\nfactory_path = "toys.stages.create_raises_on_build"'
    )


pytestmark = pytest.mark.timeout(300)  # subprocesses of python -m omnitrio: past the global 120 s when busy


def test_run_prints_each_streamed_text_chunk_on_its_own_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--config", str(write(tmp_path, WORDS)), "hello omni world"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == ['[join text] "HELLO "', '[join text] "OMNI "', '[join text] "WORLD "']


def test_run_audio_out_writes_the_audio_of_the_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "answer.wav"
    spoken = '{"task": "chat", "messages": [{"role": "user", "content": "hi"}], "modalities": ["text", "audio"]}'
    assert main(["run", "--config", str(write(tmp_path, VOICE)), "--audio-out", str(out), spoken]) == 0
    assert f"audio written to {out}" in capsys.readouterr().err
    with wave.open(str(out)) as wav:
        assert (wav.getframerate(), wav.getnframes()) == (RATE, RATE // 4)


def test_run_audio_out_of_a_plain_string_without_audio_says_how_to_ask_for_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "answer.wav"
    assert main(["run", "--config", str(write(tmp_path, VOICE)), "--audio-out", str(out), "hello"]) == 1
    err = capsys.readouterr().err
    assert f"the pipeline sent no audio; {out} was not written" in err
    assert """ask for audio with '{"task": "speech", "input": "hello"}'""" in err
    assert not out.exists()


@pytest.mark.parametrize("process", ["", 'process = "p1"'], ids=["inline", "in a process"])
def test_a_factory_that_raises_at_startup_prints_one_line_then_its_traceback_once(tmp_path: Path, process: str) -> None:
    config = write(tmp_path, broken(process))
    done = subprocess.run(
        [sys.executable, "-m", "omnitrio", "run", "--config", str(config), "hi"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stderr.splitlines()
    assert done.returncode == 1
    assert lines[0].startswith("omnitrio: error: ") and "stage 'tag'" in lines[0]
    assert "RuntimeError('cannot load weights on purpose')" in lines[0]
    assert done.stderr.count("Traceback (most recent call last)") == 1
    assert "create_raises_on_build" in done.stderr and "Exception Group" not in done.stderr
    assert lines[-1] == "RuntimeError: cannot load weights on purpose"
    assert len(lines) <= 10


def test_check_says_what_a_pipeline_serves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "chat.toml"
    config.write_text(
        'name = "chat"\nserves = ["chat"]\n\n[[stages]]\nname = "echo"\n'
        'factory_path = "toys.stages.create_echo"\nterminal = true\n'
    )
    assert main(["check", str(config)]) == 0
    assert "\n  serves: chat\n" in capsys.readouterr().out
