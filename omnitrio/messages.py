"""What the caller of ``pipeline.stream`` receives.

``stream`` yields :class:`StreamMessage` items in the order the terminal stage produced
them, then exactly one :class:`CompleteMessage` per terminal stage that finished.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class StreamMessage:
    """One chunk from a terminal stage; ``chunk_id`` counts from 0 per stage."""

    request_id: str
    from_stage: str
    chunk_id: int
    chunk: Any
    modality: str | None = None


@attrs.frozen
class CompleteMessage:
    """The final result (``payload.data``) of one terminal stage."""

    request_id: str
    from_stage: str
    result: Any
