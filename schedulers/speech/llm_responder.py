"""The language-model responder: a conversation in, the model's answer out, streamed as it is written.

:class:`LLMResponder` is a :class:`~schedulers.engine.intake.EngineIntake` around a
:class:`~schedulers.llamacpp.engine.LlamaBatchEngine` (continuous batching on llama.cpp) that reads
:mod:`schedulers.speech.conversation` inputs, renders them with the model's chat template and
answers ``payload.data = {"text", "finish_reason", "usage"}``.

Per request, in order, when the request streams (``params["stream"]``):

* to ``tts`` (the answer is spoken): ``stream`` chunks ``{"text": sentences}``, each sent as soon as
  its sentence is complete, the unfinished rest in one last chunk before the result;
* to ``text_out`` (text only): ``stream`` chunks ``{"text": delta}``, one per step that adds text.

Concatenated, the chunks are exactly the result's ``text``.  Until a request's first chunk is out
(a request that does not stream: until its first token) the engine treats it as urgent: answers
already under way sit out its steps (:class:`~schedulers.llamacpp.engine.LlamaBatchEngine`).

``stop`` strings end the answer before them (``finish_reason: "stop"``); text that might be the
start of a stop string is held back until it is not.  An answer that starts repeating itself
(:mod:`schedulers.speech.repetition`) ends before the repeat (``"stop"``); a spoken answer never
says a repeated sentence.

A conversation with a ``session_id`` keeps its keys/values between turns, and the prompt's opening
(the system prompt and the first role header) is computed once for all.  A spoken answer to a
conversation without a system message gets ``voice_system_prompt``.  A chat whose prompt plus
``max_tokens`` does not fit the context fails with
:class:`~omnitrio.contract.InvalidRequest` (``context_length_exceeded``, ``param="messages"``); a
kept conversation (one with a ``session_id``: a realtime session's) that grew past it loses its
oldest turns instead (the system prompt stays).
Offered ``tools`` are rendered into a chat template that reads them, and the calls the model writes
(in its template's format, :mod:`schedulers.llamacpp.tool_calls`) come back as the result's
``"tool_calls"`` with ``finish_reason: "tool_calls"``, the words before them as its ``text``.  What
is or may still become a call is never streamed: it is held until it is not (then streamed as
text) or until the answer ends; a call that does not parse is the result's text, streamed to
``text_out`` at the end but never spoken.  ``tool_choice``: ``"none"`` renders no tools and reads
no calls; ``"auto"`` (or none given) lets the model choose; ``"required"`` or a named function
constrains the answer to one well-formed call of an offered (or the named) function
(:mod:`schedulers.llamacpp.tool_grammar`).  A model that cannot call tools here (its template does
not read them, or its call format is not one of those read) answers a request that lets it choose
(``"auto"`` or none given) in words, as if none were offered, and the log says so once; one that
requires a call is an ``InvalidRequest`` naming ``tools``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

import attrs

from omnitrio.contract import IncomingMessage, InvalidRequest, OmniRequest, OutgoingMessage, StagePayload
from schedulers.ar.kv_sessions import common_prefix
from schedulers.engine.admission import completion_budget
from schedulers.engine.intake import EngineIntake
from schedulers.llamacpp.chat import LlamaChat
from schedulers.llamacpp.engine import LlamaBatchEngine, LlamaRequest, TokenEvent
from schedulers.llamacpp.sampling import Sampling
from schedulers.llamacpp.tool_calls import ToolCallFormat
from schedulers.llamacpp.tool_grammar import forced_call_grammar, forced_function
from schedulers.speech.conversation import Conversation, conversation
from schedulers.speech.repetition import repeat_start
from schedulers.speech.tts import complete_sentences_end

TEXT: Final = {"modality": "text"}
log = logging.getLogger("schedulers.speech")


@attrs.frozen
class Defaults:
    """What a request that does not say gets (OpenAI's names; ``repeat_penalty`` is llama.cpp's)."""

    max_tokens: int = 256
    temperature: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_penalty: float = 1.0
    voice_system_prompt: str | None = None


@attrs.define(eq=False)
class _Answer:
    payload: StagePayload
    prompt_tokens: int
    target: str | None  # where text streams; None: it does not
    by_sentence: bool
    stop: list[str]
    tools: ToolCallFormat | None  # how the model writes the calls read from this answer; None: none are
    tokens: int = 0  # answer tokens so far (the end-of-turn token not counted)
    raw: bytes = b""  # their text's bytes (a character may still be split)
    sent: int = 0  # characters of the answer already streamed


class LLMResponder(EngineIntake[LlamaBatchEngine, _Answer]):
    """See the module docstring; ``stream_target(payload)`` names the stage text streams to."""

    def __init__(
        self,
        engine: LlamaBatchEngine,
        chat: LlamaChat,
        *,
        stream_target: Callable[[StagePayload], str],
        defaults: Defaults | None = None,
        threads: int = 1,
        solo_threads: int | None = None,
    ) -> None:
        """``threads`` decode while several requests share the model; ``solo_threads`` (when given) while
        one request has it to itself (a voice user waiting alone gets its first words sooner)."""
        super().__init__()
        self.engine = engine
        self.chat = chat
        self.stream_target = stream_target
        self.defaults = defaults or Defaults()
        self.threads = threads
        self.solo_threads = solo_threads
        self._threads_now = threads
        self._live: dict[str, _Answer] = {}
        self._opening = chat.encode_chat([{"role": "user", "content": "\x00"}])  # default system prompt + header
        self._said_no_tools = False
        self.warm_up.step("chat", lambda: self._warm_up(spoken=False))
        self.warm_up.step("spoken chat", lambda: self._warm_up(spoken=True))

    def _warm_up(self, *, spoken: bool) -> None:
        """Served as a real request is (:meth:`rehearse`): a short chat answered in text alone (on the solo
        threads), or one answered for speech beside a text one (two rows, on the shared threads; the voice
        system prompt's keys and values are kept for every later spoken answer)."""
        self.engine.model.set_threads(self._threads_now)
        asked = [("warm-up", ["text"]), *([("warm-up-spoken", ["text", "audio"])] if spoken else [])]
        messages = []
        for rid, modalities in asked:
            hi = [{"role": "user", "content": "Hi"}]
            chat = OmniRequest({"task": "chat", "messages": hi, "modalities": modalities, "max_tokens": 2})
            messages.append(IncomingMessage(rid, "new_request", StagePayload(rid, chat)))
        failed = [out.data for out in self.rehearse(messages) if out.type == "error"]
        if failed:
            raise failed[0]

    def _parse(self, request_id: str, payload: Any) -> tuple[LlamaRequest, _Answer]:
        return self.parse(request_id, payload)

    def parse(self, request_id: str, payload: Any) -> tuple[LlamaRequest, _Answer]:
        """The engine request a ``new_request`` payload describes, and what its answer streams where."""
        if not isinstance(payload, StagePayload):
            raise ValueError(f"new_request data must be a StagePayload, got {type(payload).__name__}")
        conv = conversation(payload)
        streams = bool(payload.request.params.get("stream", False))
        target = self.stream_target(payload)
        messages = list(conv.messages)
        if not messages:
            raise ValueError("messages: there is nothing to answer (no message and no transcript)")
        voice = self.defaults.voice_system_prompt
        if target == "tts" and voice and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": voice})
        tools = self._offered(conv.tools, conv.tool_choice)
        prompt, max_tokens = self._fit(messages, conv.max_tokens, tools, trim=conv.session_id is not None)
        calls = self.chat.tool_format if tools else None
        system = messages[0] if messages[0]["role"] == "system" else None
        opening = self.chat.encode(self.chat.render([system], add_generation_prompt=False)) if system else self._opening
        request = LlamaRequest(
            request_id=request_id,
            prompt_ids=prompt,
            max_new_tokens=max_tokens,
            sampling=self._sampling(conv, self._grammar(calls, tools, conv.tool_choice)),
            session_id=conv.session_id,
            shared_prefix_len=common_prefix(opening, prompt),
        )
        answer = _Answer(payload, len(prompt), target if streams else None, target == "tts", conv.stop, calls)
        return request, answer

    def _offered(self, tools: list[dict[str, Any]] | None, choice: Any) -> list[dict[str, Any]] | None:
        """The tools rendered into the prompt (see the module docstring): None when none are offered, when
        ``choice`` is ``"none"``, or when this model cannot call them and ``choice`` lets it answer in words."""
        if not tools or choice == "none":
            return None
        if self.chat.tool_format is not None:
            return tools
        if not self.chat.supports_tools:
            why = "this model's chat template has no place for tools, so it cannot call them"
        else:
            why = (
                "this model's chat template reads tools, but its model writes calls in a format this server "
                "does not read (it reads Hermes/Qwen <tool_call>, Llama 3 JSON and Mistral [TOOL_CALLS])"
            )
        if choice not in (None, "auto"):
            raise InvalidRequest(f"tools: {why}; tool_choice {choice!r} needs a call", param="tools")
        if not self._said_no_tools:
            self._said_no_tools = True
            name = self.engine.model.path.name
            log.warning("%s will not call the tools requests offer: %s; it answers in words", name, why)
        return None

    @staticmethod
    def _grammar(calls: ToolCallFormat | None, tools: list[dict[str, Any]] | None, choice: Any) -> str | None:
        """The grammar that forces a call when ``choice`` requires one (or names a function), else None."""
        if calls is None or not tools or not (choice == "required" or forced_function(choice)):
            return None
        return forced_call_grammar(calls, tools, forced_function(choice))

    def _sampling(self, conv: Conversation, grammar: str | None = None) -> Sampling:
        d = self.defaults
        temperature = d.temperature if conv.temperature is None else conv.temperature
        top_p = 1.0 if conv.top_p is None else conv.top_p
        if top_p == 0:
            temperature, top_p = 0.0, 1.0
        return Sampling(
            temperature=temperature,
            top_p=top_p,
            seed=conv.seed,
            frequency_penalty=d.frequency_penalty if conv.frequency_penalty is None else conv.frequency_penalty,
            presence_penalty=d.presence_penalty if conv.presence_penalty is None else conv.presence_penalty,
            repeat_penalty=d.repeat_penalty,
            logit_bias=_known_tokens(conv.logit_bias, self.engine.model.n_vocab),
            grammar=grammar,
        )

    def _fit(
        self, messages: list[dict[str, Any]], asked: int | None, tools: list[dict[str, Any]] | None, *, trim: bool
    ) -> tuple[list[int], int]:
        """The prompt ids and the answer's token budget; a kept conversation (a realtime session's) drops
        its oldest turns after the system prompt until it fits, a chat that does not fit is refused."""
        context = self.engine.context_length
        keep = 1 if messages and messages[0]["role"] == "system" else 0
        while True:
            prompt = self.chat.encode_chat(messages, tools)
            try:
                return prompt, completion_budget(len(prompt), asked, context=context, default=self.defaults.max_tokens)
            except InvalidRequest as refused:
                if refused.code != "context_length_exceeded" or not trim or len(messages) - keep <= 1:
                    raise
            del messages[keep]

    @property
    def decode_threads(self) -> int:
        """The threads the model decodes on now (``threads`` or ``solo_threads``)."""
        return self._threads_now

    def _step(self) -> list[OutgoingMessage]:
        alone = len(self.engine.running) + len(self.engine.waiting) <= 1
        threads = self.solo_threads if alone and self.solo_threads is not None else self.threads
        if threads != self._threads_now:
            self.engine.model.set_threads(threads)
            self._threads_now = threads
        try:
            events, _ = self.engine.step()
        except Exception as exc:  # the model failed: every request of this step fails, the rest go on
            failed = list(self.engine.running)
            for rid in failed:
                self.engine.abort(rid)
                self._live.pop(rid, None)
            return [OutgoingMessage(rid, "error", exc) for rid in failed]
        return [out for event in events if event.request_id in self._live for out in self._outputs(event)]

    def _outputs(self, event: TokenEvent) -> list[OutgoingMessage]:
        rid = event.request_id
        answer = self._live[rid]
        calls = answer.tools
        if not event.ends_turn:
            answer.tokens += 1
            answer.raw += self.chat.piece(event.token_id, calls.markers if calls else frozenset())
        text = answer.raw.decode("utf-8", errors="replace")
        finish = event.finish_reason
        at = calls.call_start(text) if calls else None
        words, called = (text, "") if at is None else (text[:at], text[at:])  # called: the calls, from their marker
        for stop in answer.stop:
            found = words.find(stop)
            if found >= 0:
                words, called, finish = words[:found], "", "stop"
        repeat = repeat_start(words)
        if repeat is not None:
            words, called, finish = words[: max(repeat, answer.sent)], "", "stop"
        if finish is not None and event.finish_reason is None:
            self.engine.abort(rid)
        if finish is None:
            shown = len(words) if calls is None else calls.streamable(words)
            outputs = self._stream(rid, answer, words, shown, done=False)
            if outputs or answer.target is None:
                self.engine.settle(rid)  # its caller has its first words (or waits for the whole answer)
            return outputs
        del self._live[rid]
        tool_calls = calls.parse(called) if calls and called else None
        if tool_calls and not words.strip():
            words = ""  # held, never streamed: white space before a call is not an answer
        text = words if tool_calls or not called else words + called
        spoken_text = words if answer.by_sentence else text  # a call never goes to speech, parsed or not
        outputs = self._stream(rid, answer, spoken_text, len(spoken_text), done=True)
        usage = {"prompt_tokens": answer.prompt_tokens, "completion_tokens": answer.tokens}
        payload = answer.payload
        payload.data = {"text": text, "finish_reason": finish, "usage": usage}
        if tool_calls:
            payload.data |= {"finish_reason": "tool_calls", "tool_calls": tool_calls}
        return [*outputs, OutgoingMessage(rid, "result", payload)]

    def _stream(self, rid: str, answer: _Answer, text: str, shown: int, *, done: bool) -> list[OutgoingMessage]:
        """Stream what of ``text`` is new and may go now (at most its first ``shown`` characters)."""
        if answer.target is None:
            return []
        ready = shown
        if not done:
            if text[:ready].endswith("\ufffd"):  # a character split across tokens
                ready = len(text[:ready].rstrip("\ufffd"))
            hold = max((len(s) - 1 for s in answer.stop), default=0)
            ready = max(answer.sent, ready - hold)
            if answer.by_sentence:
                ready = max(answer.sent, complete_sentences_end(text[:ready]))
        if ready <= answer.sent:
            return []
        chunk = text[answer.sent : ready]
        answer.sent = ready
        if answer.by_sentence and not chunk.strip():
            return []
        return [OutgoingMessage(rid, "stream", {"text": chunk}, target=answer.target, metadata=dict(TEXT))]


def _known_tokens(biases: dict[int, float] | None, vocab_size: int) -> dict[int, float]:
    """``logit_bias`` checked against the vocabulary: an id beyond it is the caller's mistake."""
    for token in biases or {}:
        if token >= vocab_size:
            raise InvalidRequest(
                f"logit_bias names token {token}; this model's token ids are 0..{vocab_size - 1}", param="logit_bias"
            )
    return dict(biases or {})
