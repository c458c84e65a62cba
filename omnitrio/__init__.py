"""omnitrio: multi-stage omni model pipelines on trio structured concurrency.

The names here are the whole Python API a pipeline user needs; the scheduler contract
lives in :mod:`omnitrio.contract`.
"""

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
