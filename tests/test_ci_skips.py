"""Under ``OMNITRIO_CI=1`` (what ``.ci/run`` sets) a skip CI must not have fails the run (tests/ci_skips.py).

Each case runs pytest on a small module of its own, with the hooks loaded (``-p tests.ci_skips``),
with and without the variable.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ci_skips import CI_ENV

ROOT = Path(__file__).resolve().parent.parent

MISSING_PACKAGE = """
import pytest
pytest.importorskip("omnitrio_no_such_package")

def test_it():
    pass
"""
MISSING_BROWSER = """
import pytest

@pytest.fixture
def browser():
    pytest.skip("chromium is not installed and apt-get cannot install it")

def test_it(browser):
    pass
"""
NEEDS_A_GPU = """
import pytest

@pytest.mark.gpu
def test_marked():
    pytest.skip("no device")

def test_said():
    pytest.skip("needs CUDA")

@pytest.mark.xfail(reason="not yet", strict=True)
def test_expected_to_fail():
    assert False
"""


def run(tmp_path: Path, source: str, *, ci: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_case.py").write_text(source)
    env = {key: value for key, value in os.environ.items() if key != CI_ENV}
    if ci:
        env[CI_ENV] = "1"
    command = [sys.executable, "-m", "pytest", "-p", "tests.ci_skips", "-p", "no:cacheprovider", "-p", "no:randomly"]
    command += ["-c", os.devnull, "--rootdir", str(tmp_path), "-rs", "-q", str(tmp_path / "test_case.py")]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("source", [MISSING_PACKAGE, MISSING_BROWSER], ids=["package", "browser"])
def test_a_skip_for_something_missing_fails_under_ci_and_stays_a_skip_without(tmp_path: Path, source: str) -> None:
    alone = run(tmp_path, source, ci=False)
    assert alone.returncode in (0, 5) and "1 skipped" in alone.stdout, alone.stdout  # 5: the module was all skipped
    strict = run(tmp_path, source, ci=True)
    assert strict.returncode != 0, strict.stdout
    assert f"{CI_ENV} is set, so this skip fails the run" in strict.stdout
    assert ("omnitrio_no_such_package" if source is MISSING_PACKAGE else "chromium is not installed") in strict.stdout


def test_a_gpu_skip_and_an_expected_failure_stay_as_they_are_under_ci(tmp_path: Path) -> None:
    strict = run(tmp_path, NEEDS_A_GPU, ci=True)
    assert strict.returncode == 0, strict.stdout
    assert "2 skipped, 1 xfailed" in strict.stdout


def test_ci_runs_the_readme_command_with_the_variable_set() -> None:
    script = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert f"export {CI_ENV}=1" in script[:-1]  # the last line is the README's command itself (tests/test_install.py)
    assert f"{CI_ENV}=1" in (ROOT / "README.md").read_text()
