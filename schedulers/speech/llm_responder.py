"""The language-model responder: a conversation in, the model's answer out, streamed as it is written.

:class:`LLMResponder` is an :class:`~schedulers.ar.scheduler.ARScheduler` (continuous batching over
the GGUF model) that reads :mod:`schedulers.speech.conversation` inputs, renders them with the
model's chat template and answers ``payload.data = {"text", "finish_reason", "usage"}``.

Per request, in order, when the request streams (``params["stream"]``):

* to ``tts`` (the answer is spoken): ``stream`` chunks ``{"text": sentences}``, each sent as soon as
  its sentence is complete, the unfinished rest in one last chunk before the result;
* to ``text_out`` (text only): ``stream`` chunks ``{"text": delta}``, one per step that adds text.

Concatenated, the chunks are exactly the result's ``text``.  ``stop`` strings end the answer before
them (``finish_reason: "stop"``); text that might be the start of a stop string is held back until
it is not.  A conversation with a ``session_id`` keeps its keys/values between turns, and the
prompt's opening (the system prompt and the first role header) is computed once for all.
Conversations longer than the context lose their oldest turns (the system prompt stays); one
whose last message and ``max_tokens`` alone exceed it is refused with ``InvalidRequest``
(``context_length_exceeded``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import attrs

from omnitrio.contract import InvalidRequest, OutgoingMessage, StagePayload
from schedulers.ar.chat_tokenizer import ChatTokenizer
from schedulers.ar.engine import ARBatchEngine, GenerationRequest, TokenEvent
from schedulers.ar.kv_sessions import common_prefix
from schedulers.ar.scheduler import ARScheduler
from schedulers.speech.conversation import Conversation, conversation
from schedulers.speech.tts import complete_sentences_end

TEXT: Final = {"modality": "text"}


@attrs.define(eq=False)
class _Answer:
    payload: StagePayload
    prompt_tokens: int
    target: str | None  # where text streams; None: it does not
    by_sentence: bool
    stop: list[str]
    ids: list[int] = attrs.field(factory=list)
    sent: int = 0  # characters of the answer already streamed


class LLMResponder(ARScheduler):
    """See the module docstring; ``stream_target(payload)`` names the stage text streams to."""

    def __init__(
        self,
        engine: ARBatchEngine,
        tokenizer: ChatTokenizer,
        *,
        stream_target: Callable[[StagePayload], str],
        default_max_tokens: int = 256,
        default_temperature: float = 0.0,
        threads: int = 2,
    ) -> None:
        super().__init__(engine, None, default_max_new_tokens=default_max_tokens, stream=False)
        self.chat = tokenizer
        self.stream_target = stream_target
        self.default_temperature = default_temperature
        self.threads = threads
        self._answers: dict[str, _Answer] = {}
        probe = tokenizer.encode_chat([{"role": "user", "content": "\x00"}])
        self._opening = probe  # the template's default system prompt and first user header

    def warm_up_serving_thread(self) -> None:
        import torch

        torch.set_num_threads(self.threads)
        self.engine.add(GenerationRequest("warm-up", self.chat.encode_chat([{"role": "user", "content": "Hi"}]), 2))
        while self.engine.has_work:
            self.engine.step()

    def parse(self, request_id: str, payload: Any) -> tuple[GenerationRequest, bool]:
        if not isinstance(payload, StagePayload):
            raise ValueError(f"new_request data must be a StagePayload, got {type(payload).__name__}")
        conv = conversation(payload)
        _refuse_tools(conv)
        max_tokens = conv.max_tokens or self.default_max_new_tokens
        prompt = self._fit(conv, max_tokens)
        temperature = self.default_temperature if conv.temperature is None else conv.temperature
        top_p = 1.0 if conv.top_p is None else conv.top_p
        if top_p == 0:
            temperature = 0.0
        system = conv.messages[0] if conv.messages[0]["role"] == "system" else None
        opening = self.chat.encode(self.chat.render([system], add_generation_prompt=False)) if system else self._opening
        request = GenerationRequest(
            request_id=request_id,
            prompt_ids=prompt,
            max_new_tokens=max_tokens,
            eos_token_id=self.chat.eos_token_id,
            temperature=temperature,
            top_p=top_p or 1.0,
            seed=conv.seed,
            frequency_penalty=conv.frequency_penalty or 0.0,
            presence_penalty=conv.presence_penalty or 0.0,
            logit_bias=_known_tokens(conv.logit_bias, self.engine.config.vocab_size),
            session_id=conv.session_id,
            shared_prefix_len=common_prefix(opening, prompt),
        )
        streams = bool(payload.request.params.get("stream", False))
        target = self.stream_target(payload) if streams else None
        self._answers[request_id] = _Answer(payload, len(prompt), target, target == "tts", conv.stop)
        return request, False

    def _fit(self, conv: Conversation, max_tokens: int) -> list[int]:
        """The prompt ids, dropping the oldest turns after the system prompt until the answer fits.

        A request that cannot fit even so raises :class:`InvalidRequest` ``context_length_exceeded``
        naming the context and the request's size (the caller's mistake: a 400, not a stage failure)."""
        context = self.engine.config.max_seq_len
        messages = list(conv.messages)
        keep = 1 if messages[0]["role"] == "system" else 0
        while True:
            prompt = self.chat.encode_chat(messages)
            if len(prompt) + max_tokens <= context:
                return prompt
            if len(messages) - keep <= 1:
                raise InvalidRequest(
                    f"This model's maximum context length is {context} tokens. However, you requested "
                    f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, {max_tokens} in the "
                    "completion). Please reduce the length of the messages or max_tokens.",
                    code="context_length_exceeded",
                    param="messages",
                )
            del messages[keep]

    def _handle(self, message: Any) -> None:
        if message.type in ("abort", "stream_chunk", "stream_done"):
            self._answers.pop(message.request_id, None)
        super()._handle(message)
        if message.type == "new_request" and message.request_id not in self._live:
            self._answers.pop(message.request_id, None)  # rejected: the error is already out

    def _step(self) -> list[OutgoingMessage]:
        outputs = super()._step()
        for rid in [rid for rid in self._answers if rid not in self._live]:  # failed with the step
            del self._answers[rid]
        return outputs

    def _outputs(self, event: TokenEvent) -> list[OutgoingMessage]:
        rid = event.request_id
        answer = self._answers[rid]
        if event.token_id != self.chat.eos_token_id:
            answer.ids.append(event.token_id)
        text = self.chat.decode(answer.ids)
        finish = event.finish_reason
        for stop in answer.stop:
            at = text.find(stop)
            if at >= 0:
                text, finish = text[:at], "stop"
        if finish is not None and event.finish_reason is None:
            self.engine.abort(rid)
        outputs = self._stream(rid, answer, text, done=finish is not None)
        if finish is None:
            return outputs
        del self._answers[rid]
        self._live.pop(rid, None)
        usage = {"prompt_tokens": answer.prompt_tokens, "completion_tokens": len(answer.ids)}
        payload = answer.payload
        payload.data = {"text": text, "finish_reason": finish, "usage": usage}
        return [*outputs, OutgoingMessage(rid, "result", payload)]

    def _stream(self, rid: str, answer: _Answer, text: str, *, done: bool) -> list[OutgoingMessage]:
        if answer.target is None:
            return []
        ready = len(text)
        if not done:
            if text.endswith("\ufffd"):  # a character split across tokens
                ready = len(text.rstrip("\ufffd"))
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


def _refuse_tools(conv: Conversation) -> None:
    """This responder cannot call tools: a request that offers them is refused, naming ``tools``."""
    if conv.tools and conv.tool_choice != "none":
        raise InvalidRequest(
            "this pipeline's language model cannot call tools; send the request without 'tools'",
            code="unsupported_parameter",
            param="tools",
        )


def _known_tokens(biases: dict[int, float] | None, vocab_size: int) -> dict[int, float]:
    """``logit_bias`` checked against the vocabulary: an id beyond it is the caller's mistake."""
    for token in biases or {}:
        if token >= vocab_size:
            raise InvalidRequest(
                f"logit_bias names token {token}; this model's token ids are 0..{vocab_size - 1}", param="logit_bias"
            )
    return dict(biases or {})
