"""Errors a caller of the pipeline may catch, and what each one promises.

Every request-level error carries the request id; a failure also names the stage that
failed and the type of the original exception, which the reference runtime loses.
"""

from __future__ import annotations


class OmnitrioError(Exception):
    """Base class of every error omnitrio raises on purpose."""


class ConfigError(OmnitrioError, ValueError):
    """A pipeline configuration is invalid; raised before anything starts.

    The message names the stage and field, e.g. ``stages[2] ('join'): wait_for needs merge_fn``.
    """


class RequestError(OmnitrioError):
    """A request did not produce a result."""

    def __init__(self, request_id: str, message: str) -> None:
        super().__init__(message)
        self.request_id = request_id


class RequestFailed(RequestError):
    """A stage failed the request; ``stage`` and ``error_type`` say where and what.

    The request's state has been dropped at every stage; other requests are untouched.
    """

    def __init__(self, request_id: str, stage: str, error_type: str, message: str) -> None:
        super().__init__(request_id, f"request {request_id!r}: stage {stage!r} raised {error_type}: {message}")
        self.stage = stage
        self.error_type = error_type
        self.error_message = message


class RequestAborted(RequestError):
    """The request was aborted (``pipeline.abort`` or the caller went away)."""

    def __init__(self, request_id: str, reason: str = "aborted") -> None:
        super().__init__(request_id, f"request {request_id!r} was {reason}")
        self.reason = reason


class RequestTimeout(RequestAborted, TimeoutError):
    """The request passed its deadline and was aborted at every stage."""

    def __init__(self, request_id: str, timeout: float) -> None:
        super().__init__(request_id, f"aborted after its {timeout:g} s deadline")
        self.timeout = timeout


class BadRequest(RequestError, ValueError):
    """A stage refused the request as the caller's mistake (its scheduler raised
    :class:`omnitrio.contract.InvalidRequest`): not a stage failure, and not retryable as sent.

    ``code`` is OpenAI's (``"context_length_exceeded"``, ``"invalid_value"``…), ``param`` the field
    at fault (or None); the message is the stage's own, for the caller to read as it is.
    The request's state has been dropped at every stage, as for :class:`RequestFailed`.
    """

    def __init__(self, request_id: str, stage: str, message: str, code: str, param: str | None) -> None:
        super().__init__(request_id, message)
        self.stage = stage
        self.code = code
        self.param = param


class Overloaded(RequestError):
    """Admission refused: the pipeline or a stage queue is at its bound. Retry later."""


class DuplicateRequest(RequestError, ValueError):
    """A request with this id is still live."""


class RelayError(OmnitrioError):
    """A relay header could not be unpacked; ``leases`` are the ids it held, to release anyway."""

    def __init__(self, message: str, leases: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.leases = leases


class PipelineClosed(OmnitrioError):
    """The pipeline is shutting down or has stopped."""


class StartupError(OmnitrioError):
    """A stage or process could not start; the message names it and carries the cause."""


def collapse(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The single exception a nursery wrapped, or the group itself when there are several.

    A caller of ``open_pipeline`` should see the ``ValueError`` its own code raised, not a
    group of one that exists only because stages run in a nursery.
    """
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    return leaves[0] if len(leaves) == 1 else group
