"""Continuous batching on llama.cpp: every live request decodes in one ``llama_decode`` per step.

Each :meth:`LlamaBatchEngine.step` builds one ``llama_batch`` holding, in order:

1. **decode**: the last token of every request that is generating (one sequence id each);
2. **prefill**: the next prompt tokens of requests still reading their prompt, then of waiting
   requests admitted now (FIFO, up to ``max_running_requests``), as many as fit the batch
   (``n_batch`` tokens): a long prompt is read over several steps, beside the others' decoding;

then one ``llama_decode``, and every request whose row produced logits gets its next token from
its own sampler (:mod:`schedulers.llamacpp.sampling`).  A request finishes with ``"stop"`` on an
end-of-turn token (``TokenEvent.ends_turn``: not part of the answer) and with ``"length"`` at
``max_new_tokens``; its sequence is then parked or freed (:mod:`schedulers.llamacpp.sequences`).

**Whoever waits first goes first.**  A request is *urgent* from its admission until its caller
has the first words it waited for (:meth:`settle`: a spoken answer's first phrase is on its way to
the voice) or it has made ``URGENT_TOKENS`` tokens.  While any request is urgent, answers already
under way skip the step's decode rows, at most ``MAX_HELD_STEPS`` steps in a row, so a user who is
waiting for an answer to start gets the speed of a smaller batch; the answers held have words in
their callers' hands already.  Holding a request delays its tokens and never changes them.

:meth:`abort` takes effect at once: the request leaves the waiting queue, or its sequence is
parked/freed, and it never produces another token.

Memory: the KV cache holds ``model.kv_tokens`` cells.  A request is admitted only when its prompt
plus ``max_new_tokens`` fits beside what running requests may still use and what parked sessions
and prefixes hold; parked sessions (least recently used first), then prefixes, are evicted to make
room, and a request that still does not fit waits for running ones to finish.  One request may use
up to ``context_length`` tokens (prompt + answer); :meth:`add` refuses more.

The engine is not thread-safe: one thread (the scheduler's) owns it.  Requests beyond the free
sequences wait, at most ``max_waiting_requests`` of them; :meth:`add` raises
:class:`~omnitrio.contract.StageOverloaded` when that queue is full.
"""

from __future__ import annotations

import collections
import enum
import random

import attrs

from schedulers.engine.admission import Admission
from schedulers.llamacpp.model import LlamaModel
from schedulers.llamacpp.sampling import Sampling, TokenSampler
from schedulers.llamacpp.sequences import Sequences

URGENT_TOKENS = 32  # a request not settled by then stops being urgent
MAX_HELD_STEPS = 16  # the most steps in a row a request already answering sits out for urgent ones


@attrs.define(eq=False)
class LlamaRequest:
    """One generation; ``shared_prefix_len`` leading prompt tokens (a system prompt) are shared."""

    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: Sampling = attrs.field(factory=Sampling)
    session_id: str | None = None
    shared_prefix_len: int = 0


@attrs.frozen
class TokenEvent:
    """One token of one request; on its last, ``finish_reason`` is set."""

    request_id: str
    token_id: int
    finish_reason: str | None = None  # "stop" | "length"
    ends_turn: bool = False  # the model's end-of-turn token: not part of the answer


@attrs.frozen
class StepStats:
    """What one step did: ``batch_size`` requests produced a token; ``prompt_tokens`` were read."""

    step: int
    batch_size: int
    prompt_tokens: int
    running: int
    waiting: int


class Phase(enum.Enum):
    PROMPT = "prompt"  # reading its prompt
    ANSWER = "answer"  # generating


@attrs.define(eq=False)
class _Running:
    request: LlamaRequest
    seq: int
    sampler: TokenSampler
    length: int  # tokens whose keys/values are in the sequence
    phase: Phase = Phase.PROMPT
    output_ids: list[int] = attrs.field(factory=list)
    urgent: bool = True  # its caller still waits for its first words
    held: int = 0  # steps sat out in a row for urgent requests

    def cached_tokens(self) -> list[int]:
        return (self.request.prompt_ids + self.output_ids)[: self.length]

    def reserved(self) -> int:
        """The most cells this request holds by its end."""
        return len(self.request.prompt_ids) + self.request.max_new_tokens


class LlamaBatchEngine:
    """Continuous batching over one :class:`LlamaModel`; see the module docstring for the step."""

    def __init__(
        self,
        model: LlamaModel,
        *,
        max_running_requests: int = 8,
        max_waiting_requests: int = 256,
        max_sessions: int = 16,
        max_prefixes: int = 4,
        context_length: int | None = None,
        seed: int = 0,
    ) -> None:
        if max_running_requests < 1:
            raise ValueError(f"LlamaBatchEngine: max_running_requests={max_running_requests} must be >= 1")
        if max_waiting_requests < 0:
            raise ValueError(f"LlamaBatchEngine: max_waiting_requests={max_waiting_requests} must be >= 0")
        if model.n_batch < max_running_requests:
            raise ValueError(f"LlamaBatchEngine: n_batch={model.n_batch} must be >= max_running_requests")
        needed = max_running_requests + max_sessions + max_prefixes
        if model.n_seq_max < needed:
            raise ValueError(
                f"LlamaBatchEngine: the context has {model.n_seq_max} sequences; max_running_requests + "
                f"max_sessions + max_prefixes = {needed}"
            )
        limit = min(model.n_ctx_train or model.kv_tokens, model.kv_tokens)
        if context_length is not None and not 1 < context_length <= limit:
            raise ValueError(f"LlamaBatchEngine: context_length={context_length} must be in [2, {limit}]")
        self.model = model
        self.context_length = context_length or limit
        self.admission = Admission(
            "llama.cpp engine", context_tokens=self.context_length, max_running=max_running_requests,
            max_waiting=max_waiting_requests, vocab_size=model.n_vocab,
        )  # fmt: skip
        self.max_running_requests = max_running_requests
        self.max_waiting_requests = max_waiting_requests
        self.sequences = Sequences(
            model.llama, model.memory, needed, max_sessions=max_sessions, max_prefixes=max_prefixes
        )
        self.waiting: collections.OrderedDict[str, LlamaRequest] = collections.OrderedDict()
        self.running: dict[str, _Running] = {}
        self._random = random.Random(seed)
        self._batch = model.llama.llama_batch_init(model.n_batch, 0, 1)
        self._steps = 0
        self.prefilled_tokens = 0  # prompt tokens computed
        self.reused_tokens = 0  # prompt tokens whose keys/values a session or shared prefix already had

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: LlamaRequest) -> None:
        """Queue a request; raises ``ValueError`` naming the bad field, or ``StageOverloaded`` when full."""
        rid = request.request_id
        problem = request.sampling.check(self.model.n_vocab)
        if problem is not None:
            raise ValueError(f"request {rid!r}: {problem}")
        self.admission.check(
            rid, request.prompt_ids, request.max_new_tokens, present=rid in self.waiting or rid in self.running,
            waiting=len(self.waiting), running=len(self.running),
        )  # fmt: skip
        if request.sampling.grammar is not None:  # parsed now, so that it cannot fail a step
            TokenSampler(self.model.llama, self.model.vocab, request.sampling, window=1, seed=0).close()
        self.waiting[rid] = request

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is; True when it was waiting or running."""
        if self.waiting.pop(request_id, None) is not None:
            return True
        state = self.running.pop(request_id, None)
        if state is None:
            return False
        self._leave(state)
        return True

    def settle(self, request_id: str) -> None:
        """Its caller has the first words it waited for: the request is no longer urgent."""
        state = self.running.get(request_id)
        if state is not None:
            state.urgent = False

    def step(self) -> tuple[list[TokenEvent], StepStats]:
        """Run one step (one ``llama_decode``); see the module docstring."""
        rows: list[tuple[_Running, int]] = []  # (request, prompt tokens it reads this step)
        sampled: list[tuple[_Running, int]] = []  # (request, batch position of its logits)
        n = 0
        self._admit()
        someone_waits = any(state.urgent for state in self.running.values())
        for state in self.running.values():
            if state.phase is Phase.ANSWER:
                if someone_waits and not state.urgent and state.held < MAX_HELD_STEPS:
                    state.held += 1
                    continue
                state.held = 0
                self._put(n, state.output_ids[-1], state.length, state.seq, True)
                rows.append((state, 1))
                sampled.append((state, n))
                n += 1
        prompt_tokens = 0
        for state in self._prompting():
            if n >= self.model.n_batch:
                break
            prompt = state.request.prompt_ids
            chunk = prompt[state.length : state.length + self.model.n_batch - n]
            for i, token in enumerate(chunk):
                last = state.length + i == len(prompt) - 1
                self._put(n, token, state.length + i, state.seq, last)
                if last:
                    sampled.append((state, n))
                n += 1
            rows.append((state, len(chunk)))
            prompt_tokens += len(chunk)
        events: list[TokenEvent] = []
        if n:
            self._decode(n)
            for state, added in rows:
                state.length += added
            events = [self._advance(state, position) for state, position in sampled]
        self._steps += 1
        self.prefilled_tokens += prompt_tokens
        stats = StepStats(self._steps, len(events), prompt_tokens, len(self.running), len(self.waiting))
        return events, stats

    def close(self) -> None:
        for rid in list(self.running):
            self.abort(rid)
        self.model.llama.llama_batch_free(self._batch)

    # -- one step's parts ---------------------------------------------------------------

    def _prompting(self) -> list[_Running]:
        return [s for s in self.running.values() if s.phase is Phase.PROMPT]

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_running_requests:
            request = next(iter(self.waiting.values()))
            held = self.sequences.held(request.session_id)  # cells its own parked turn already counts
            if not self._make_room(len(request.prompt_ids) + request.max_new_tokens - held):
                break
            del self.waiting[request.request_id]
            seq, reused = self.sequences.claim(request.session_id, request.prompt_ids, request.shared_prefix_len)
            sampler = TokenSampler(
                self.model.llama,
                self.model.vocab,
                request.sampling,
                window=request.max_new_tokens,
                seed=self._random.getrandbits(32),
            )
            state = _Running(request, seq, sampler, reused)
            self.running[request.request_id] = state
            self.reused_tokens += reused

    def _make_room(self, cells: int) -> bool:
        """Evict parked sessions, then prefixes, until ``cells`` more fit; False if they cannot yet."""
        running = sum(s.reserved() for s in self.running.values())
        while running + self.sequences.cells + cells > self.model.kv_tokens:
            if not self.sequences.evict_one():
                return False
        return True

    def _put(self, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
        batch = self._batch
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = logits

    def _decode(self, n: int) -> None:
        self._batch.n_tokens = n
        status = self.model.llama.llama_decode(self.model.ctx, self._batch)
        while status == 1 and self.sequences.evict_one():  # no room in the KV cache: make some, retry
            status = self.model.llama.llama_decode(self.model.ctx, self._batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status} ({self.model.path.name}, {n} tokens)")

    def _advance(self, state: _Running, position: int) -> TokenEvent:
        request = state.request
        token = state.sampler.sample(self.model.ctx, position)
        state.phase = Phase.ANSWER
        state.output_ids.append(token)
        if len(state.output_ids) >= URGENT_TOKENS:
            state.urgent = False
        if state.length == len(request.prompt_ids) and request.shared_prefix_len:
            prefix = request.prompt_ids[: request.shared_prefix_len]
            if len(prefix) < len(request.prompt_ids) and self.sequences.needs_prefix(prefix):
                self.sequences.remember_prefix(state.seq, prefix)
        ends_turn = self.model.is_end(token)
        reason = "stop" if ends_turn else "length" if len(state.output_ids) >= request.max_new_tokens else None
        if reason is not None:
            del self.running[request.request_id]
            self._leave(state)
        return TokenEvent(request.request_id, token, reason, ends_turn)

    def _leave(self, state: _Running) -> None:
        state.sampler.close()
        self.sequences.release(state.seq, state.request.session_id, state.cached_tokens())
