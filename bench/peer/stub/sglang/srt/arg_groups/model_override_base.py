"""Stand-in for ``sglang.srt.arg_groups.model_override_base``."""

from __future__ import annotations

from typing import Any


def resolved_view(obj: Any, *args: Any, **kwargs: Any) -> Any:
    """sglang resolves model overrides here; the toy pipelines never reach it."""
    return obj
