"""omnitrio: multi-stage omni model pipelines on trio structured concurrency.

The names here are the whole Python API a pipeline user needs; the scheduler contract
lives in :mod:`omnitrio.contract`.  They are loaded on first use, so importing a
submodule (``omnitrio.contract``, which every scheduler imports) loads nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omnitrio.lazy_names import lazy_names

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


__getattr__, __dir__ = lazy_names(__name__, _HOMES)
