"""A stage fed by another stage's stream, many requests per step: a talker that speaks while the thinker writes.

Input, per request (``IncomingMessage``): ``stream_chunk`` s — first a prompt chunk, then one token chunk
per answer token — then ``stream_done`` and the upstream stage's result as ``new_request`` (its payload
also ends the text).  Chunks may come before the payload, as the runtime delivers them.  Output, per
request, in order: ``stream`` messages (``metadata={"modality": modality}``) holding the family's chunk
of ``frames_per_chunk`` frames (the last one shorter), then one ``result`` whose payload's data is the
family's result; or one ``error``.  A request whose payload says it does not want audio and that has no
stream, or whose stream ended before it could speak, gives 0 frames.

A family says what its text and its model are by subclassing two classes:

* :class:`StreamFedRequest`: one request's state; the family adds its text state (a :class:`TextState`,
  which says when the request can prefill: :meth:`~StreamFedRequest.text_state`), whether its next step's text is known
  (:meth:`~StreamFedRequest.decode_ready`) and what that step's input is
  (:meth:`~StreamFedRequest.decode_input`);
* :class:`StreamFedTalker`: the stage; the family builds a request (``_new_request``), reads the prompt
  chunk (``_on_prompt``) and each token chunk (``_on_token``), prefills one request into its KV row
  (``_prefill``), steps many (``_decode``), picks their codes (``_choose``, which hands each frame to
  :meth:`~StreamFedTalker._add_frame` or ends the request with :meth:`~StreamFedTalker._spoken`), and
  says what goes out (``_chunk``, ``_result``).

What a caller may rely on, for every family:

* **Streaming**: a request prefills as soon as its text allows and steps while the upstream stage is
  still decoding; a request whose next text has not come yet sits that step out while the others step.
* **Continuous batching**: each loop turn prefills the requests that became ready (one forward each)
  and steps up to ``max_batch_size`` decoding requests in one forward, in KV row order.  Each request
  has its row in one :class:`~schedulers.engine.kv_batch.KVBatch`, freed the moment its codes are done,
  it fails, or it is aborted.  A turn's outputs reach the outbox together, after its step
  (:class:`~schedulers.engine.step_loop.StepLoop`).
* **Abort** (``abort()`` from any thread, or the in-order ``abort`` message) drops the request's
  outputs and frees its state; late chunks of that life are dropped (:mod:`schedulers._idsets`).
  A failing forward fails the requests in it; the others carry on.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import attrs
import torch

from omnitrio.contract import IncomingMessage, OutgoingMessage, StagePayload, StreamItem
from schedulers._idsets import Admission, Life, RequestLedger
from schedulers.engine.kv_batch import KVBatch
from schedulers.engine.step_loop import StepLoop

logger = logging.getLogger(__name__)


class Phase(enum.Enum):
    """Where a request is, in order (it may skip to ``SPOKEN``)."""

    WAITING_PROMPT = "waiting-prompt"
    """Nothing but (maybe) its payload has come; the prompt chunk is next."""
    PREFILL = "prefill"
    """It has its prompt and prefills once :meth:`StreamFedRequest.prefill_ready`."""
    DECODING = "decoding"
    """It steps whenever :meth:`StreamFedRequest.decode_ready`."""
    SPOKEN = "spoken"
    """Its codes are done; it ends once the stream and the payload are both in."""


@attrs.define(eq=False)
class StreamFedRequest:
    """Everything the stage holds for one request but its KV row; a family subclass adds its text state."""

    life: Life
    phase: Phase = Phase.WAITING_PROMPT
    payload: StagePayload | None = None
    stream_ended: bool = False
    step: int = 0
    """Decode steps taken since the prefill."""
    unsent: list[Any] = attrs.field(factory=list)
    """Frames chosen and not yet sent."""
    num_frames: int = 0

    @property
    def request_id(self) -> str:
        return self.life.request_id

    def finished(self) -> bool:
        """Its codes are done and the stream and payload are both in: the result may go."""
        return self.phase is Phase.SPOKEN and self.stream_ended and self.payload is not None

    # -- what a family defines ----------------------------------------------------------

    def text_state(self) -> TextState | None:
        """The family's text of this request: None before its prompt chunk and after :meth:`release`."""
        raise NotImplementedError

    def end_text(self) -> None:
        """The upstream stream is over: no more token chunks."""
        if (text := self.text_state()) is not None:
            text.end()

    def speakable(self) -> bool:
        """In ``PREFILL`` with the text ended: whether there is anything to voice."""
        text = self.text_state()
        return text is None or text.speakable()

    def prefill_ready(self) -> bool:
        """Its prompt has come and its text allows the prefill."""
        text = self.text_state()
        return text is not None and text.prefill_ready()

    def decode_ready(self) -> bool:
        raise NotImplementedError

    def decode_input(self) -> torch.Tensor | None:
        """The next decode step's input, or None while its text is unknown."""
        raise NotImplementedError

    def release(self) -> None:
        """Its codes are done: drop what only stepping needed (text, last frame)."""


class TextState(Protocol):
    """What the stage asks of a family's text of one request (:meth:`StreamFedRequest.text_state`):
    ``end()`` when the upstream stream is over; ``speakable()``, with the text ended, whether there is
    anything to voice; ``prefill_ready()``, whether the prompt and text so far allow the prefill."""

    def end(self) -> None: ...
    def speakable(self) -> bool: ...
    def prefill_ready(self) -> bool: ...


R = TypeVar("R", bound=StreamFedRequest)


@attrs.frozen
class StreamEdges:
    """The classes a stage's input edges carry: the prompt chunk, each token chunk, the upstream result's
    payload data; anything else is refused (an ``error`` naming what came)."""

    prompt: type
    token: type
    result: type


@attrs.frozen
class _Free:
    """Inbox message data: free the state of ``life``, aborted from another thread."""

    life: Life


class StreamFedTalker(StepLoop, Generic[R]):
    """The stage's lifecycle (module docstring); ``stage`` names it in errors, ``modality`` its stream
    outputs, ``edges`` what its input carries."""

    stage: str = "talker"
    modality: str = "codes"
    edges: StreamEdges = StreamEdges(object, object, object)

    def __init__(self, *, layers: int, device: torch.device, frames_per_chunk: int, max_batch_size: int) -> None:
        if frames_per_chunk < 1 or max_batch_size < 1:
            raise ValueError(
                f"{self.stage}: frames_per_chunk and max_batch_size must be >= 1, got "
                f"{frames_per_chunk}, {max_batch_size}"
            )
        super().__init__()
        self.frames_per_chunk = frames_per_chunk
        self.max_batch_size = max_batch_size
        self.kv: KVBatch[str] = KVBatch(layers, device=device, rows=max_batch_size)
        self.batch_sizes: list[int] = []
        self._ledger = RequestLedger(self._new_request_queued, retire_on_abort=True)
        self._requests: dict[str, R] = {}

    # -- what a family defines ----------------------------------------------------------

    def _new_request(self, life: Life) -> R:
        raise NotImplementedError

    def _on_prompt(self, req: R, data: Any) -> None:
        """Build ``req``'s text state from the prompt chunk (already of ``edges.prompt``)."""
        raise NotImplementedError

    def _on_token(self, req: R, data: Any) -> None:
        """Add one token chunk (already of ``edges.token``) to ``req``'s text."""
        raise NotImplementedError

    def _prefill(self, req: R) -> Any:
        """Prefill ``req`` into a new row of :attr:`kv`; returns what :meth:`_choose` reads for it."""
        raise NotImplementedError

    def _decode(self, decoding: Sequence[tuple[R, torch.Tensor]]) -> Sequence[Any]:
        """One forward of every ``(request, decode input)`` (in KV row order); one output per request."""
        raise NotImplementedError

    def _choose(self, stepped: Sequence[tuple[R, Any]]) -> None:
        """Pick each stepped request's code: :meth:`_add_frame`, :meth:`_spoken` or :meth:`_fail` each."""
        raise NotImplementedError

    def _chunk(self, req: R, frames: list[Any]) -> Any:
        """The stream chunk's data for ``frames`` (at least one, in order)."""
        raise NotImplementedError

    def _result(self, req: R) -> Any:
        """The result payload's data once ``req`` is finished."""
        raise NotImplementedError

    def _wants_audio(self, result: Any) -> bool:
        return bool(result.want_audio)

    # -- state --------------------------------------------------------------------------

    @property
    def active_requests(self) -> int:
        """Requests holding state here (the scheduler thread's view)."""
        return len(self._requests)

    def abort(self, request_id: str) -> None:
        """Non-blocking; the request's outputs stop now and its state is freed before the next step."""
        outcome = self._ledger.abort(request_id)
        if isinstance(outcome, Life):
            self._inbox.put(IncomingMessage(request_id, "abort", _Free(outcome)))

    def _new_request_queued(self, request_id: str) -> bool:
        with self._inbox.mutex:
            return any(
                isinstance(msg, IncomingMessage) and msg.type == "new_request" and msg.request_id == request_id
                for msg in self._inbox.queue
            )

    # -- messages (scheduler thread) --------------------------------------------------

    def _handle(self, message: IncomingMessage) -> None:
        rid = message.request_id
        match message.type:
            case "new_request":
                match self._ledger.admit_payload(rid, message.data):
                    case Life() as life:
                        self._guarded(self._request(life), self._on_payload, message.data)
                    case Admission.DUPLICATE:
                        error = ValueError(f"{self.stage}: duplicate request {rid!r}")
                        self.emit([OutgoingMessage(rid, "error", error)])
            case "stream_chunk" | "stream_done":
                streamed = self._ledger.admit_stream(rid, is_done=message.type == "stream_done")
                if streamed is not None:
                    req = self._request(streamed)
                    if message.type == "stream_done":
                        self._guarded(req, self._on_end_of_text)
                    else:
                        self._guarded(req, self._on_chunk, message.data)
            case "abort":
                if isinstance(message.data, _Free):
                    self._free(message.data.life)
                else:
                    boundary = self._ledger.close_in_order(rid)
                    if boundary.life is not None:
                        self._free(boundary.life)

    def _request(self, life: Life) -> R:
        req = self._requests.get(life.request_id)
        if req is None or req.life is not life:
            req = self._requests[life.request_id] = self._new_request(life)
        return req

    def _on_payload(self, req: R, payload: Any) -> None:
        if not isinstance(payload, StagePayload) or not isinstance(payload.data, self.edges.result):
            raise ValueError(
                f"{self.stage}: new_request data must be a StagePayload holding a {self.edges.result.__name__}, "
                f"got {payload!r:.80}"
            )
        req.payload = payload
        self._on_end_of_text(req)

    def _on_end_of_text(self, req: R) -> None:
        req.stream_ended = True
        req.end_text()
        if req.phase is Phase.WAITING_PROMPT:
            if req.payload is None:
                return  # the payload says whether audio was wanted
            if self._wants_audio(req.payload.data):
                raise ValueError(f"{self.stage}: the stream ended without its {self.edges.prompt.__name__}")
            req.phase = Phase.SPOKEN
        if req.phase is Phase.PREFILL and not req.speakable():
            req.phase = Phase.SPOKEN
        self._maybe_finish(req)

    def _on_chunk(self, req: R, item: Any) -> None:
        if not isinstance(item, StreamItem):
            raise ValueError(f"{self.stage}: stream chunks must be StreamItems, got {item!r:.80}")
        data = item.data
        if req.phase is Phase.WAITING_PROMPT:
            if not isinstance(data, self.edges.prompt):
                first = self.edges.prompt.__name__
                raise ValueError(f"{self.stage}: the stream must start with a {first}, got {type(data).__name__}")
            self._on_prompt(req, data)
            req.phase = Phase.PREFILL
        elif not isinstance(data, self.edges.token):
            raise ValueError(
                f"{self.stage}: expected a {self.edges.token.__name__} after the {self.edges.prompt.__name__}, "
                f"got {type(data).__name__}"
            )
        elif req.phase is not Phase.SPOKEN:
            self._on_token(req, data)

    # -- stepping (scheduler thread) ----------------------------------------------------

    def _has_work(self) -> bool:
        return any(
            (req.phase is Phase.PREFILL and req.prefill_ready()) or (req.phase is Phase.DECODING and req.decode_ready())
            for req in self._requests.values()
        )

    def _step(self) -> list[OutgoingMessage]:
        """Prefill, decode, choose; the outputs go through :meth:`emit` as they come (an empty list back)."""
        stepped: list[tuple[R, Any]] = []
        for req in [r for r in self._requests.values() if r.phase is Phase.PREFILL and r.prefill_ready()]:
            try:
                stepped.append((req, self._prefill(req)))
                req.phase = Phase.DECODING
            except Exception as exc:
                self._fail(req, exc)
        ready = [r for r in self._requests.values() if r.phase is Phase.DECODING and r.decode_ready()]
        inputs = {
            req.request_id: (req, x) for req in ready[: self.max_batch_size] if (x := req.decode_input()) is not None
        }
        decoding = [inputs[rid] for rid in self.kv.order(inputs)]  # in row order: neighbours read in place
        if decoding:
            try:
                outputs = self._decode(decoding)
            except Exception as exc:
                for req, _ in decoding:
                    self._fail(req, exc)
            else:
                for (req, _), out in zip(decoding, outputs, strict=True):
                    req.step += 1
                    stepped.append((req, out))
        if stepped:
            self.batch_sizes.append(len(stepped))
            self._choose(stepped)
        return []

    # -- outputs and ending -------------------------------------------------------------

    def _add_frame(self, req: R, frame: Any) -> None:
        """One more frame of ``req``'s speech; a chunk goes out once ``frames_per_chunk`` are waiting."""
        req.unsent.append(frame)
        req.num_frames += 1
        if len(req.unsent) >= self.frames_per_chunk:
            self._emit(req, [self._chunk_message(req)])

    def _chunk_message(self, req: R) -> OutgoingMessage:
        data = self._chunk(req, req.unsent)
        req.unsent = []
        return OutgoingMessage(req.request_id, "stream", data, metadata={"modality": self.modality})

    def _spoken(self, req: R) -> None:
        """Its codes are done: free the KV now, send what is left; the result waits for the payload."""
        self.kv.remove(req.request_id)
        req.phase = Phase.SPOKEN
        req.release()
        if req.unsent:
            self._emit(req, [self._chunk_message(req)])
        self._maybe_finish(req)

    def _maybe_finish(self, req: R) -> None:
        if not req.finished():
            return
        assert req.payload is not None
        messages = [self._chunk_message(req)] if req.unsent else []
        req.payload.data = self._result(req)
        messages.append(OutgoingMessage(req.request_id, "result", req.payload))
        self._drop_state(req.life)
        if self._ledger.end(req.life):
            self.emit(messages)

    def _emit(self, req: R, messages: list[OutgoingMessage]) -> None:
        if not self._ledger.is_aborted(req.life):
            self.emit(messages)

    def _guarded(self, req: R, handler: Callable[..., None], *args: Any) -> None:
        try:
            handler(req, *args)
        except Exception as exc:
            self._fail(req, exc)

    def _fail(self, req: R, exc: Exception) -> None:
        logger.debug("%s: request %r failed", self.stage, req.request_id, exc_info=exc)
        self._drop_state(req.life)
        if self._ledger.end(req.life, failed_stream=True):
            self.emit([OutgoingMessage(req.request_id, "error", exc)])

    def _free(self, life: Life) -> None:
        self._drop_state(life)
        self._ledger.end(life)

    def _drop_state(self, life: Life) -> None:
        req = self._requests.get(life.request_id)
        if req is not None and req.life is life:
            del self._requests[life.request_id]
            self.kv.remove(life.request_id)
