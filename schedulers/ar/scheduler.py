"""``ARScheduler``: the stage scheduler around :class:`ARBatchEngine` (continuous batching on CPU torch).

Input (``IncomingMessage``):

* ``new_request`` with a :class:`~omnitrio.contract.StagePayload`.  The prompt is taken from
  ``payload.data``: a ``str`` (text), a list of ints (token ids), or a dict with ``"prompt_token_ids"``
  (or ``"input_ids"``) or ``"prompt"`` (or ``"text"``); the entry stage's ``{"raw_inputs": ...}`` is
  unwrapped first.  Knobs come from ``payload.request.params``, overridden by the same keys in that
  dict: ``max_new_tokens`` (default: the scheduler's), ``temperature`` (0 = greedy), ``ignore_eos``,
  ``return_hidden_states`` and ``stream``.
* ``abort``: the request stops at the next step boundary and produces nothing more.
* ``stream_chunk`` / ``stream_done``: not accepted; the request fails with an error naming it.

Output (``OutgoingMessage``), in order per request:

* zero or more ``stream`` with ``data={"token_ids": [id]}`` and ``metadata={"modality": "tokens"}``,
  one per step, when the request streams (``params["stream"]``, or always with ``stream=True``);
  text is the business of a detokenizer stage downstream;
* one ``result`` whose ``data`` is the payload, its ``data`` dict updated with ``prompt_token_ids``,
  ``output_token_ids`` (the stream's ids, in order, eos included), ``finish_reason`` (``"stop"`` or
  ``"length"``), ``text`` (when the scheduler has a tokenizer) and, if asked, ``hidden_states``
  (``[generated, dim]`` float32 tensor: the final hidden state that produced each output token);
* or one ``error``: ``StageOverloaded`` when the waiting queue is full, ``ValueError`` for a bad
  request, or the exception a model step raised (that fails every request in that step's batch).

``prepare`` (optional) maps each ``new_request`` payload, on the scheduler thread, before its prompt
is read: a pipeline whose requests do not already carry a prompt (chat messages, say) builds one
there; a ``ValueError`` it raises fails that request only.

``batch_sizes`` records how many requests produced a token in each step (the last
``stats_history`` steps); ``on_step`` is called with each step's :class:`StepStats` on the scheduler
thread.  The inbox is unbounded so the IO side never blocks; the bound applies to the engine's
waiting queue when the scheduler thread takes the message.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, Final

import attrs
import torch

from omnitrio.contract import OutgoingMessage, StagePayload
from schedulers.ar.engine import ARBatchEngine, GenerationRequest, StepStats, TokenEvent
from schedulers.ar.model import ModelConfig, build_model
from schedulers.ar.tokenizer import Tokenizer, load_tokenizer
from schedulers.engine.intake import RequestIntake

_DTYPES: Final = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def prompt_and_params(payload: Any) -> tuple[str | list[int], dict[str, Any]]:
    """The prompt (text or token ids) and the knobs a ``new_request`` payload carries (formats above)."""
    if not isinstance(payload, StagePayload):
        raise ValueError(f"new_request data must be a StagePayload, got {type(payload).__name__}")
    data = payload.data
    if isinstance(data, dict) and "raw_inputs" in data and not _PROMPT_KEYS & data.keys():
        data = data["raw_inputs"]
    params = dict(payload.request.params)
    if isinstance(data, dict):
        params.update({k: v for k, v in data.items() if k in _PARAM_KEYS})
    match data:
        case str() as text:
            return text, params
        case list() | tuple() if all(isinstance(t, int) for t in data):
            return list(data), params
        case {"prompt_token_ids": list() | tuple() as ids} | {"input_ids": list() | tuple() as ids} if all(
            isinstance(t, int) for t in ids
        ):
            return list(ids), params
        case {"prompt": str() as text} | {"text": str() as text}:
            return text, params
        case _:
            raise ValueError(
                "prompt must be text, a list of token ids, or a dict with 'prompt_token_ids'/'input_ids' "
                f"or 'prompt'/'text'; got {type(data).__name__}"
            )


def parse_generation_request(
    request_id: str, payload: Any, tokenizer: Tokenizer | None, default_max_new_tokens: int
) -> tuple[GenerationRequest, bool]:
    """The engine request a ``new_request`` payload describes, and whether it asks to stream."""
    prompt, params = prompt_and_params(payload)
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer; this scheduler has none (send token ids)")
        prompt = tokenizer.encode(prompt)
    eos = None if params.get("ignore_eos") or tokenizer is None else tokenizer.eos_token_id
    request = GenerationRequest(
        request_id=request_id,
        prompt_ids=prompt,
        max_new_tokens=int(params.get("max_new_tokens", default_max_new_tokens)),
        eos_token_id=eos,
        temperature=float(params.get("temperature", 0.0)),
        return_hidden_states=bool(params.get("return_hidden_states", False)),
    )
    return request, bool(params.get("stream", False))


_PROMPT_KEYS: Final = frozenset({"prompt_token_ids", "input_ids", "prompt", "text"})
_PARAM_KEYS: Final = frozenset({"max_new_tokens", "temperature", "ignore_eos", "return_hidden_states", "stream"})


@attrs.define(eq=False)
class _Live:
    payload: StagePayload
    streams: bool
    prompt_ids: list[int]


class ARScheduler(RequestIntake):
    """Continuous-batching AR scheduler; the formats are in the module docstring."""

    def __init__(
        self,
        engine: ARBatchEngine,
        tokenizer: Tokenizer | None = None,
        *,
        default_max_new_tokens: int = 64,
        stream: bool | None = None,
        on_step: Callable[[StepStats], None] | None = None,
        stats_history: int = 10_000,
        prepare: Callable[[StagePayload], StagePayload] | None = None,
    ) -> None:
        super().__init__()
        self.engine = engine
        self.prepare = prepare
        self.tokenizer = tokenizer
        self.default_max_new_tokens = default_max_new_tokens
        self.stream = stream
        self.on_step = on_step
        self.batch_sizes: collections.deque[int] = collections.deque(maxlen=stats_history)
        self._live: dict[str, _Live] = {}

    def _has_work(self) -> bool:
        return self.engine.has_work

    def _accept(self, request_id: str, data: Any) -> None:
        payload = data
        if self.prepare is not None and isinstance(payload, StagePayload):
            payload = self.prepare(payload)
        request, wants_stream = self.parse(request_id, payload)
        self.engine.add(request)
        streams = self.stream if self.stream is not None else wants_stream
        self._live[request_id] = _Live(payload, streams, request.prompt_ids)

    def _forget(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self._live.pop(request_id, None)

    def parse(self, request_id: str, payload: Any) -> tuple[GenerationRequest, bool]:
        """The engine request a ``new_request`` payload describes, and whether it streams (formats above)."""
        return parse_generation_request(request_id, payload, self.tokenizer, self.default_max_new_tokens)

    def _step(self) -> list[OutgoingMessage]:
        batch = list(self.engine.running) + list(self.engine.waiting)[: self._free_slots()]
        try:
            events, stats = self.engine.step()
        except Exception as exc:  # the model failed: every request of this step fails, the rest go on
            for rid in batch:
                self.engine.abort(rid)
                self._live.pop(rid, None)
            return [OutgoingMessage(rid, "error", exc) for rid in batch]
        self.batch_sizes.append(stats.batch_size)
        if self.on_step is not None:
            self.on_step(stats)
        return [out for event in events for out in self._outputs(event)]

    def _free_slots(self) -> int:
        return self.engine.max_running_requests - len(self.engine.running)

    def _outputs(self, event: TokenEvent) -> list[OutgoingMessage]:
        rid = event.request_id
        live = self._live[rid]
        payload = live.payload
        outputs = []
        if live.streams:
            data = {"token_ids": [event.token_id]}
            outputs.append(OutgoingMessage(rid, "stream", data, metadata={"modality": "tokens"}))
        if event.finish_reason is None:
            return outputs
        del self._live[rid]
        output_ids = event.output_ids or []
        result: dict[str, Any] = {
            "prompt_token_ids": live.prompt_ids,
            "output_token_ids": output_ids,
            "finish_reason": event.finish_reason,
        }
        if self.tokenizer is not None:
            result["text"] = self.tokenizer.decode(output_ids)
        if event.hidden_states is not None:
            result["hidden_states"] = event.hidden_states
        if isinstance(payload.data, dict):
            payload.data.update(result)
        else:
            payload.data = result
        outputs.append(OutgoingMessage(rid, "result", payload))
        return outputs


def create_tiny_ar_scheduler(
    *,
    seed: int = 0,
    dim: int = 256,
    n_layers: int = 4,
    n_heads: int = 8,
    n_kv_heads: int = 2,
    max_seq_len: int = 512,
    dtype: str = "float32",
    max_running_requests: int = 16,
    max_waiting_requests: int = 256,
    default_max_new_tokens: int = 64,
    stream: bool | None = None,
    tokenizer_vocab_size: int = 2048,
) -> ARScheduler:
    """Stage factory: the tiny random-weight Llama with the locally trained tokenizer (no downloads)."""
    if dtype not in _DTYPES:
        raise ValueError(f"create_tiny_ar_scheduler: dtype={dtype!r} must be one of {sorted(_DTYPES)}")
    tokenizer = load_tokenizer(tokenizer_vocab_size)
    engine = build_tiny_engine(
        tokenizer,
        seed=seed,
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        max_seq_len=max_seq_len,
        dtype=_DTYPES[dtype],
        max_running_requests=max_running_requests,
        max_waiting_requests=max_waiting_requests,
    )
    return ARScheduler(engine, tokenizer, default_max_new_tokens=default_max_new_tokens, stream=stream)


def build_tiny_engine(
    tokenizer: Any,
    *,
    seed: int,
    dim: int,
    n_layers: int,
    n_heads: int,
    n_kv_heads: int,
    max_seq_len: int,
    max_running_requests: int,
    max_waiting_requests: int,
    dtype: torch.dtype = torch.float32,
) -> ARBatchEngine:
    """The continuous-batching engine over a tiny random Llama sized for ``tokenizer``."""
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size,
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        ffn_dim=(dim * 8 // 3 + 63) // 64 * 64,
        max_seq_len=max_seq_len,
        seed=seed,
    )
    return ARBatchEngine(
        build_model(config, dtype),
        max_running_requests=max_running_requests,
        max_waiting_requests=max_waiting_requests,
        seed=seed,
    )
