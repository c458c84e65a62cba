"""ruff and mypy run with the tests, so CI fails on a lint or type error like on a test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.timeout(600)
def test_ruff_finds_nothing() -> None:
    result = run("ruff", "check", "omnitrio", "schedulers", "toys", "tests", "bench", "examples")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(600)
def test_code_is_formatted() -> None:
    result = run("ruff", "format", "--check", "omnitrio", "schedulers", "toys", "tests", "bench", "examples")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)  # a cold mypy run takes most of a minute alone, minutes on a busy machine
def test_mypy_finds_no_type_errors() -> None:
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
