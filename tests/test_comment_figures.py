"""Code comments and docstrings carry no measured figures: those go to bench/results with their load."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEASURED = re.compile(
    r"(≈|~|about |takes? |spends? )\s*[0-9][0-9.,]*\s*(µs|ms|tok/s|tokens/s|x faster|× faster)"
    r"|[0-9][0-9.,]*\s*[x×] (faster|slower)"
)


def test_no_measured_figures_in_runtime_or_scheduler_code() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for folder in ("omnitrio", "schedulers")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if MEASURED.search(line)
    ]
    assert found == []
