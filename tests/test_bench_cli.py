"""The benchmark suite's own plumbing: results survive a missing chart library; the peer's venv is checked."""

from __future__ import annotations

import json
import sys
import venv
from pathlib import Path

import pytest

import bench.__main__ as suite
from bench.peer import setup_venv

SAVED = Path(suite.__file__).resolve().parent / "results" / "latest.json"


def test_results_are_written_and_the_chart_skipped_in_one_line_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(suite, "RESULTS", tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ModuleNotFoundError
    doc = json.loads(SAVED.read_text())
    written = suite.write(doc)
    assert written == [tmp_path / "latest.json", tmp_path / "latest.md"]
    assert json.loads((tmp_path / "latest.json").read_text())["started"] == doc["started"]
    assert "omnitrio" in (tmp_path / "latest.md").read_text()
    assert not (tmp_path / "latest.png").exists()
    assert capsys.readouterr().out.splitlines() == [
        "chart skipped: matplotlib is not installed (pip install -e '.[bench]' to draw latest.png)"
    ]


def test_a_peer_venv_where_numpy_does_not_import_is_named_with_the_command_that_fixes_it(tmp_path: Path) -> None:
    venv.EnvBuilder(with_pip=False).create(tmp_path / "venv")
    problems = setup_venv.import_problems(tmp_path / "venv" / "bin" / "python", ["json", "numpy"])
    assert list(problems) == ["numpy"] and "No module named 'numpy'" in problems["numpy"]
    advice = setup_venv.advice(problems)
    assert "numpy: ModuleNotFoundError" in advice
    assert "-m pip install numpy==2.4.6\n" in advice
    assert "python -m bench.peer setup` again" in advice
