"""The responder that asks the user's own LLM server: any OpenAI-compatible chat endpoint.

:class:`RemoteResponder` is a stage scheduler with the same contract as
:class:`~schedulers.speech.llm_responder.LLMResponder`: it reads :mod:`schedulers.speech.conversation`
inputs and answers ``payload.data = {"text", "finish_reason", "usage"}`` (plus ``"tool_calls"`` with
``finish_reason: "tool_calls"`` when the model called a tool, :mod:`schedulers.speech.chat_stream`),
streaming the text as it comes when the request streams (``params["stream"]``): to ``tts`` by complete
sentences (the unfinished rest in one last chunk before the result), to ``text_out`` by deltas.
Concatenated, the chunks are the result's ``text``.  ``stop``, ``max_tokens``, the sampling knobs,
``tools`` and ``tool_choice`` go to the server under OpenAI's names.  Every request carries its whole
conversation (a realtime response's messages are the session's history); ``session_id`` is not used,
so what the server reuses between turns is its own prompt cache.

Threads: :meth:`RemoteResponder.start` runs one asyncio loop in the scheduler thread; each request is
one task on it streaming ``POST /chat/completions`` through one ``httpx.AsyncClient``, at most
``max_concurrency`` at once (the others wait their turn in arrival order).  Messages come in through
:meth:`RemoteResponder.enqueue` (``inbox.put`` is the same), in order.  :meth:`RemoteResponder.abort`
(any thread, never blocks; an ``abort`` message does the same) ends the request's life at once: from
the moment it returns the request has no further output, and its task is cancelled, which closes its
HTTP stream: the server sees the connection go and stops generating.  A ``new_request`` after an
abort is a new life of the id.

Errors, one ``error`` output each: a 4xx from the server about the request (not auth or a wrong path)
is an :class:`~omnitrio.contract.InvalidRequest` carrying the server's message, code and param (the
caller's mistake: a 400); an unreachable server, any other status or a broken stream is a
``RuntimeError`` naming the server's URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, Final

import attrs
import httpx

from omnitrio.contract import IncomingMessage, InvalidRequest, OutgoingMessage, StagePayload, put_messages
from schedulers.speech.chat_stream import StreamedAnswer, request_body, sse_chunks
from schedulers.speech.conversation import conversation
from schedulers.speech.pipeline import wants_audio
from schedulers.speech.tts import complete_sentences_end

TEXT: Final = {"modality": "text"}
_NOT_ABOUT_THE_REQUEST: Final = frozenset({401, 403, 404, 405, 407, 408, 429})


@attrs.frozen
class ChatServer:
    """Where the answers come from: ``base_url`` ends before ``/chat/completions`` (``.../v1``)."""

    base_url: str
    model: str
    api_key: str | None = attrs.field(default=None, repr=False)
    timeout_s: float = 120.0

    @property
    def url(self) -> str:
        return f"{self.base_url.rstrip('/')}/chat/completions"


@attrs.define
class _Speaker:
    """What of an answer's text has been streamed, and where it streams (``None``: nowhere)."""

    request_id: str
    target: str | None
    sent: int = 0

    def say(self, text: str, *, done: bool) -> list[OutgoingMessage]:
        """The chunk of ``text`` ready to stream: whole sentences for ``tts``, or all, when ``done``."""
        if self.target is None:
            return []
        by_sentence = self.target == "tts"
        ready = len(text) if done or not by_sentence else max(self.sent, complete_sentences_end(text))
        if ready <= self.sent:
            return []
        chunk, self.sent = text[self.sent : ready], ready
        if by_sentence and not chunk.strip():
            return []
        return [OutgoingMessage(self.request_id, "stream", {"text": chunk}, target=self.target, metadata=dict(TEXT))]


@attrs.define(eq=False)
class _Life:
    """One life of a request id here: from its ``new_request`` to its last output or its abort."""

    request_id: str
    payload: Any
    ended: bool = False  # aborted (or answered): it may put nothing more on the outbox
    task: asyncio.Task[None] | None = None


class _Inbox:
    """The inbox the runtime (or a test) puts messages in: each goes straight to :meth:`RemoteResponder.enqueue`."""

    maxsize = 0

    def __init__(self, put: Callable[[IncomingMessage], None]) -> None:
        self.put = put


class RemoteResponder:
    """See the module docstring; ``stream_target(payload)`` names the stage text streams to."""

    def __init__(
        self,
        server: ChatServer,
        *,
        stream_target: Callable[[StagePayload], str],
        max_concurrency: int = 8,
        default_max_tokens: int = 256,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.server = server
        self.stream_target = stream_target
        self.max_concurrency = max_concurrency
        self.default_max_tokens = default_max_tokens
        self.inbox = _Inbox(self.enqueue)
        self.outbox: queue.Queue[OutgoingMessage] = queue.Queue()
        self._loop = asyncio.new_event_loop()  # runs in start(); callbacks posted before then wait for it
        self._lock = threading.Lock()  # guards _lives and every put on the outbox
        self._lives: dict[str, _Life] = {}
        # The loop's own, touched only on it:
        self._stop_event = asyncio.Event()
        self._slots = asyncio.Semaphore(max_concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        headers = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}
        timeout = httpx.Timeout(server.timeout_s, connect=min(server.timeout_s, 10.0))
        limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
        self._client = httpx.AsyncClient(headers=headers, timeout=timeout, limits=limits)

    def warm_up_serving_thread(self) -> None:
        """Nothing to load: the server is asked on the first request (it may start after this stage)."""

    def start(self) -> None:
        """Answer until :meth:`stop` (blocking, on the scheduler thread)."""
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    def stop(self) -> None:
        self._post(self._stop_event.set)

    def enqueue(self, message: IncomingMessage) -> None:
        """Take ``message`` (any thread, never blocks), in order with the others.

        An ``abort`` ends the request's life here and now, as :meth:`abort` does; a ``new_request``
        starts a new life."""
        match message.type:
            case "new_request":
                life = _Life(message.request_id, message.data)
                with self._lock:
                    duplicate = message.request_id in self._lives
                    if not duplicate:
                        self._lives[message.request_id] = life
                if duplicate:
                    self._put(life, OutgoingMessage(life.request_id, "error", _duplicate(life.request_id)), force=True)
                else:
                    self._post(self._begin, life)
            case "abort":
                self.abort(message.request_id)
            case _:
                pass  # stream_chunk / stream_done: a responder's inputs come whole

    def abort(self, request_id: str) -> None:
        """End the request's life: from the moment this returns it has no further output; its HTTP
        stream is closed as soon as the loop runs."""
        with self._lock:
            life = self._lives.pop(request_id, None)
            if life is not None:
                life.ended = True
        if life is not None:
            self._post(self._cancel, life)

    def _post(self, fn: Callable[..., object], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nothing runs any more
            self._loop.call_soon_threadsafe(fn, *args)

    def _put(self, life: _Life, *messages: OutgoingMessage, force: bool = False, last: bool = False) -> None:
        """Put ``messages`` unless the life has ended; ``last`` ends it."""
        with self._lock:
            if life.ended and not force:
                return
            put_messages(self.outbox, messages)
            if last:
                life.ended = True
                if self._lives.get(life.request_id) is life:
                    del self._lives[life.request_id]

    async def _serve(self) -> None:
        try:
            await self._stop_event.wait()
        finally:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._client.aclose()

    def _begin(self, life: _Life) -> None:
        if life.ended:
            return  # aborted before the loop got to it
        life.task = self._loop.create_task(self._answer(life))
        self._tasks.add(life.task)
        life.task.add_done_callback(self._tasks.discard)

    def _cancel(self, life: _Life) -> None:
        if life.task is not None:
            life.task.cancel()

    async def _answer(self, life: _Life) -> None:
        rid, payload = life.request_id, life.payload
        try:
            if not isinstance(payload, StagePayload):
                raise ValueError(f"new_request data must be a StagePayload, got {type(payload).__name__}")
            async with self._slots:
                payload.data = await self._ask(life, payload)
        except Exception as exc:
            self._put(life, OutgoingMessage(rid, "error", exc), last=True)
        else:
            self._put(life, OutgoingMessage(rid, "result", payload), last=True)

    async def _ask(self, life: _Life, payload: StagePayload) -> dict[str, Any]:
        rid = life.request_id
        conv = conversation(payload)
        body = request_body(conv, model=self.server.model, max_tokens=conv.max_tokens or self.default_max_tokens)
        streams = bool(payload.request.params.get("stream", False))
        speaker = _Speaker(rid, self.stream_target(payload) if streams else None)
        answer = StreamedAnswer()
        url = self.server.url
        try:
            async with self._client.stream("POST", url, json=body) as response:
                if response.status_code >= 400:
                    raise _refusal(response.status_code, await response.aread(), url)
                async for chunk in sse_chunks(response.aiter_lines()):
                    answer.add(chunk)
                    self._put(life, *speaker.say(answer.text, done=False))
        except httpx.HTTPError as exc:
            raise RuntimeError(f"the LLM server at {url} failed: {type(exc).__name__}: {exc}") from exc
        result = answer.result()
        self._put(life, *speaker.say(result["text"], done=True))
        return result


def _duplicate(request_id: str) -> ValueError:
    return ValueError(f"request {request_id!r} is already being answered")


def _refusal(status: int, body: bytes, url: str) -> Exception:
    """The error for a server's non-2xx answer (see the module docstring)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict):
        message = str(error.get("message") or error)
    elif isinstance(parsed, dict) and "detail" in parsed:  # FastAPI's validation errors
        message = json.dumps(parsed["detail"])[:1000]
    else:
        message = body.decode("utf-8", "replace")[:1000] or f"HTTP {status}"
    if 400 <= status < 500 and status not in _NOT_ABOUT_THE_REQUEST:
        code = error.get("code") if isinstance(error, dict) else None
        param = error.get("param") if isinstance(error, dict) else None
        return InvalidRequest(
            f"the LLM server refused the request: {message}",
            code=code if isinstance(code, str) and code else "invalid_value",
            param=param if isinstance(param, str) else None,
        )
    return RuntimeError(f"the LLM server at {url} answered HTTP {status}: {message}")


def _stream_target(payload: StagePayload) -> str:
    return "tts" if wants_audio(payload.request.inputs) else "text_out"


def create_remote_responder_stage(
    *,
    base_url: str,
    model: str,
    api_key: str | None = None,
    api_key_env: str | None = None,
    max_concurrency: int = 8,
    max_tokens: int = 256,
    timeout_s: float = 120.0,
) -> RemoteResponder:
    """The default pipeline's responder asking an OpenAI-compatible server (llama-server, Ollama, vLLM,
    SGLang) at ``base_url`` (e.g. ``http://127.0.0.1:8080/v1``) for ``model``.

    The key is ``api_key``, or read from the environment variable named ``api_key_env`` when the stage
    starts (so it stays out of config files); neither: no ``Authorization`` header.  ``max_tokens``
    applies to requests that give none; ``timeout_s`` bounds the wait for each piece of an answer."""
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"responder base_url must be an http(s) URL ending before /chat/completions, got {base_url!r}")
    if api_key is None and api_key_env is not None:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise ValueError(f"responder api_key_env names {api_key_env!r}, which is not set in the environment")
    return RemoteResponder(
        ChatServer(base_url, model, api_key, timeout_s),
        stream_target=_stream_target,
        max_concurrency=max_concurrency,
        default_max_tokens=max_tokens,
    )
