"""What every test module shares: under ``OMNITRIO_CI=1`` a skip CI must not have fails (tests/ci_skips.py)."""

from tests.ci_skips import pytest_make_collect_report, pytest_runtest_makereport

__all__ = ["pytest_make_collect_report", "pytest_runtest_makereport"]
