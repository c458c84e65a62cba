"""omnitrio: multi-stage omni model pipelines on trio structured concurrency.

The names here are the whole Python API a pipeline user needs; the scheduler contract
lives in :mod:`omnitrio.contract`.  They are loaded on first use, so importing a
submodule (``omnitrio.contract``, which every scheduler imports) loads nothing else.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omnitrio.config import EndpointsConfig, FactoryArgs, PipelineConfig, StageConfig
    from omnitrio.contract import IncomingMessage, OmniRequest, OutgoingMessage, StagePayload, StreamItem
    from omnitrio.errors import (
        ConfigError,
        DuplicateRequest,
        Overloaded,
        PipelineClosed,
        RequestAborted,
        RequestFailed,
        RequestTimeout,
    )
    from omnitrio.messages import CompleteMessage, StreamMessage
    from omnitrio.pipeline import Pipeline
    from omnitrio.runner import open_pipeline

_HOMES = {
    "CompleteMessage": "omnitrio.messages",
    "ConfigError": "omnitrio.errors",
    "DuplicateRequest": "omnitrio.errors",
    "EndpointsConfig": "omnitrio.config",
    "FactoryArgs": "omnitrio.config",
    "IncomingMessage": "omnitrio.contract",
    "OmniRequest": "omnitrio.contract",
    "OutgoingMessage": "omnitrio.contract",
    "Overloaded": "omnitrio.errors",
    "Pipeline": "omnitrio.pipeline",
    "PipelineClosed": "omnitrio.errors",
    "PipelineConfig": "omnitrio.config",
    "RequestAborted": "omnitrio.errors",
    "RequestFailed": "omnitrio.errors",
    "RequestTimeout": "omnitrio.errors",
    "StageConfig": "omnitrio.config",
    "StagePayload": "omnitrio.contract",
    "StreamItem": "omnitrio.contract",
    "StreamMessage": "omnitrio.messages",
    "open_pipeline": "omnitrio.runner",
}

__all__ = [
    "CompleteMessage",
    "ConfigError",
    "DuplicateRequest",
    "EndpointsConfig",
    "FactoryArgs",
    "IncomingMessage",
    "OmniRequest",
    "OutgoingMessage",
    "Overloaded",
    "Pipeline",
    "PipelineClosed",
    "PipelineConfig",
    "RequestAborted",
    "RequestFailed",
    "RequestTimeout",
    "StageConfig",
    "StagePayload",
    "StreamItem",
    "StreamMessage",
    "open_pipeline",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'omnitrio' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
