"""A streaming vocoder that decodes many requests at once, in steps of its own, between inbox messages.

:class:`SteppedVocoderBase` is a :class:`~schedulers.vocoder.StreamingVocoderBase` whose chunks never
decode on arrival (``should_decode`` is False): after each inbox message, while no other message waits,
it runs :meth:`~SteppedVocoderBase.step` (one decode over every request with work ready, batched across
them) until the step says nothing more is ready, so new chunks and aborts are read between steps.

A step hands each request's audio to :meth:`~SteppedVocoderBase.emit_step`: a request whose state says
``complete`` is finished there (its audio, then its result, then its state released); any other gets its
audio back to go out with the step's others in one :func:`~omnitrio.contract.put_messages`, or nothing once
it was aborted.  :meth:`~SteppedVocoderBase.fail_request` fails one request (an ``error`` output) or, when
it no longer lives, drops its state.  Every hook runs on the scheduler thread.  :func:`talker_total`
checks the talker's count of what it streamed against what arrived.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from omnitrio.contract import IncomingMessage, OutgoingMessage, StagePayload
from schedulers._idsets import Life
from schedulers.vocoder import StateT, StreamingVocoderBase


class SteppedVocoderBase(StreamingVocoderBase[StateT]):
    """The stepped streaming vocoder (module docstring); a subclass writes :meth:`step`."""

    def should_decode(self, state: StateT, *, is_final: bool) -> bool:
        return False  # decoding happens in step, across requests

    def decode_delta(self, request_id: str, state: StateT, *, is_final: bool) -> None:
        return None

    @abstractmethod
    def step(self) -> bool:
        """Decode what is ready across requests; True when more may be ready right away."""

    def _take(self, msg: IncomingMessage) -> Life | None:
        life = super()._take(msg)
        while self.inbox.empty() and self.step():
            pass
        return life

    def emit_step(self, request_id: str, state: Any, audio: list[OutgoingMessage]) -> list[OutgoingMessage]:
        """What one request's step sends with the others: nothing once ``state.complete`` (the request is
        finished here, ``audio`` and its result sent) or once it was aborted; else ``audio``."""
        if state.complete:
            payload = self.stream_payloads[request_id]
            result = StagePayload(request_id, payload.request, self.final_result_data(request_id, payload, state))
            self.complete_stream_request(request_id, [*audio, OutgoingMessage(request_id, "result", data=result)])
            return []
        life = self._ledger.live_life(request_id)
        return audio if life is not None and not self._ledger.is_aborted(life) else []

    def fail_request(self, request_id: str, exc: Exception) -> None:
        """Fail the live request ``request_id`` with ``exc``; a request no longer live only loses its state."""
        life = self._ledger.live_life(request_id)
        if life is not None:
            self._fail(life, exc)
        else:
            self._clear_state(request_id)


def talker_total(stage: str, unit: str, said: int, received: int) -> int:
    """``said``, the talker's count of ``unit`` (``"codes"``, ``"frames"``) in all, when it equals the count
    that ``received`` on the stream; else a ``ValueError`` naming ``stage`` and both counts."""
    if said != received:
        raise ValueError(
            f"{stage}: the talker's result says num_{unit}={said}, but {received} {unit} arrived on the stream"
        )
    return said


__all__ = ["SteppedVocoderBase", "talker_total"]
