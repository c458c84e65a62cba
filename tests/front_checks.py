"""Checks of the front kit's processor (schedulers.front.processor) that every family's tests run."""

from __future__ import annotations

from typing import Any

import pytest


def assert_refuses_video(processor: Any) -> None:
    """A prompt with a video part is a ``ValueError`` naming video: no family serves a video encoder."""
    text = processor.render([{"role": "user", "content": [{"type": "video", "video": "clip.mp4"}]}])
    with pytest.raises(ValueError, match="video"):
        processor(text)
