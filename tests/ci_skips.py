"""Under ``OMNITRIO_CI=1`` a skipped test fails the run, unless CI cannot have what it needs.

``.ci/run`` sets the variable (README, "Run the tests"). A test that skips because a package, a
browser or a tool is missing tests nothing, and a green run would hide it; so with the variable set
such a skip is reported as a failure that quotes the skip's reason. What stays a skip is only what
CI cannot have: a GPU and the SGLang engine's own venv — a test marked ``gpu`` or ``sglang_engine``,
or a skip whose reason names CUDA or SGLang (:data:`ALLOWED_REASON`). This covers skips at
collection (a module's ``pytest.importorskip``: the run then stops with a collection error), in a
fixture and in the test body; an expected failure (``xfail``) is left alone. Without the variable
nothing changes.

:mod:`tests.conftest` imports the two hooks; ``-p tests.ci_skips`` loads them into any pytest run.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator, Iterable
from typing import Any

import pytest

CI_ENV = "OMNITRIO_CI"
ALLOWED_MARKERS = frozenset({"gpu", "sglang_engine"})
ALLOWED_REASON = re.compile(r"\bCUDA\b|\bSGLang\b|\bsglang\b")


def strict() -> bool:
    """Whether skips fail: ``OMNITRIO_CI`` is set to anything but empty or ``0``."""
    return os.environ.get(CI_ENV, "") not in ("", "0")


def skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    """The reason a skipped report gives (pytest keeps it as ``(path, line, reason)``)."""
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)


def allowed(reason: str, markers: Iterable[str]) -> bool:
    return bool(ALLOWED_MARKERS & set(markers)) or ALLOWED_REASON.search(reason) is not None


def _fail(report: pytest.CollectReport | pytest.TestReport, reason: str) -> None:
    report.outcome = "failed"
    report.longrepr = (
        f"{CI_ENV} is set, so this skip fails the run: CI must run it, or say why it cannot "
        f"(tests/ci_skips.py). The skip said: {reason}"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if strict() and report.skipped and not hasattr(report, "wasxfail"):
        reason = skip_reason(report)
        if not allowed(reason, (mark.name for mark in item.iter_markers())):
            _fail(report, reason)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, Any]:
    report = yield
    if strict() and report.skipped:
        reason = skip_reason(report)
        if not allowed(reason, (mark.name for mark in collector.iter_markers())):
            _fail(report, reason)
    return report
