"""The responder that asks the user's own LLM server: any OpenAI-compatible chat endpoint.

:class:`RemoteResponder` is a stage scheduler with the same contract as
:class:`~schedulers.speech.llm_responder.LLMResponder`: it reads :mod:`schedulers.speech.conversation`
inputs and answers ``payload.data = {"text", "finish_reason", "usage"}`` (plus ``"tool_calls"`` with
``finish_reason: "tool_calls"`` when the model called a tool, :mod:`schedulers.speech.chat_stream`),
streaming the text as it comes when the request streams (``params["stream"]``): to ``tts`` by complete
sentences (the unfinished rest in one last chunk before the result), to ``text_out`` by deltas.
Concatenated, the chunks are the result's ``text``.  ``stop``, ``max_tokens``, the sampling knobs,
``tools`` and ``tool_choice`` go to the server under OpenAI's names; the server keeps its own cache
(a realtime turn's messages carry the session's history).  A realtime turn whose transcript is empty
is answered with empty text, without the server.

Threads: :meth:`RemoteResponder.start` runs one asyncio loop in the scheduler thread; the inbox is read
in order by a helper thread; each request is one task on the loop streaming ``POST /chat/completions``
through one ``httpx.AsyncClient``, at most ``max_concurrency`` at once (the others wait their turn in
arrival order).  :meth:`RemoteResponder.abort` (any thread, never blocks) cancels the request's task,
which closes its HTTP stream at once: the server sees the connection go and stops generating.  An
aborted request gets no further output.

Errors, one ``error`` output each: a 4xx from the server about the request (not auth or a wrong path)
is an :class:`~omnitrio.contract.InvalidRequest` carrying the server's message, code and param (the
caller's mistake: a 400); an unreachable server, any other status or a broken stream is a
``RuntimeError`` naming the server's URL.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import queue
from collections.abc import Callable
from typing import Any, Final

import attrs
import httpx

from omnitrio.contract import IncomingMessage, InvalidRequest, OutgoingMessage, StagePayload, put_messages
from schedulers.speech.chat_stream import StreamedAnswer, request_body, sse_chunks
from schedulers.speech.conversation import conversation, unheard
from schedulers.speech.pipeline import wants_audio
from schedulers.speech.tts import complete_sentences_end

TEXT: Final = {"modality": "text"}
_STOP: Final = IncomingMessage("", "abort", data="stop the scheduler")
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
        self.inbox: queue.Queue[IncomingMessage] = queue.Queue()
        self.outbox: queue.Queue[OutgoingMessage] = queue.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}  # the loop's own: touched only on it

    def warm_up_serving_thread(self) -> None:
        """Nothing to load: the server is asked on the first request (it may start after this stage)."""

    def start(self) -> None:
        """Serve the inbox until :meth:`stop` (blocking, on the scheduler thread)."""
        asyncio.run(self._serve())

    def stop(self) -> None:
        self.inbox.put(_STOP)

    def abort(self, request_id: str) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has just closed: nothing runs any more
                loop.call_soon_threadsafe(self._cancel, request_id)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        headers = {"Authorization": f"Bearer {self.server.api_key}"} if self.server.api_key else {}
        timeout = httpx.Timeout(self.server.timeout_s, connect=min(self.server.timeout_s, 10.0))
        limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
        slots = asyncio.Semaphore(self.max_concurrency)
        reader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="remote-responder-inbox")
        self._loop = loop
        try:
            async with httpx.AsyncClient(headers=headers, timeout=timeout, limits=limits) as client:
                try:
                    while (message := await loop.run_in_executor(reader, self.inbox.get)) is not _STOP:
                        self._take(message, client, slots)
                finally:
                    tasks = list(self._tasks.values())
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._loop = None
            reader.shutdown(wait=False)  # after a failure its thread waits in inbox.get until stop()

    def _take(self, message: IncomingMessage, client: httpx.AsyncClient, slots: asyncio.Semaphore) -> None:
        rid = message.request_id
        match message.type:
            case "new_request" if rid in self._tasks:
                error = ValueError(f"request {rid!r} is already being answered")
                self.outbox.put(OutgoingMessage(rid, "error", error))
            case "new_request":
                answer = self._answer(rid, message.data, client, slots)
                self._tasks[rid] = asyncio.get_running_loop().create_task(answer)
            case "abort":
                self._cancel(rid)
            case _:
                pass  # stream_chunk / stream_done: a responder's inputs come whole

    def _cancel(self, request_id: str) -> None:
        task = self._tasks.pop(request_id, None)
        if task is not None:
            task.cancel()

    async def _answer(self, rid: str, payload: Any, client: httpx.AsyncClient, slots: asyncio.Semaphore) -> None:
        try:
            if not isinstance(payload, StagePayload):
                raise ValueError(f"new_request data must be a StagePayload, got {type(payload).__name__}")
            if unheard(payload):
                payload.data = {"text": "", "finish_reason": "stop", "usage": {}}
            else:
                async with slots:
                    payload.data = await self._ask(rid, payload, client)
        except Exception as exc:
            self.outbox.put(OutgoingMessage(rid, "error", exc))
        else:
            self.outbox.put(OutgoingMessage(rid, "result", payload))
        finally:
            if self._tasks.get(rid) is asyncio.current_task():
                del self._tasks[rid]

    async def _ask(self, rid: str, payload: StagePayload, client: httpx.AsyncClient) -> dict[str, Any]:
        conv = conversation(payload)
        body = request_body(conv, model=self.server.model, max_tokens=conv.max_tokens or self.default_max_tokens)
        streams = bool(payload.request.params.get("stream", False))
        speaker = _Speaker(rid, self.stream_target(payload) if streams else None)
        answer = StreamedAnswer()
        url = self.server.url
        try:
            async with client.stream("POST", url, json=body) as response:
                if response.status_code >= 400:
                    raise _refusal(response.status_code, await response.aread(), url)
                async for chunk in sse_chunks(response.aiter_lines()):
                    answer.add(chunk)
                    put_messages(self.outbox, speaker.say(answer.text, done=False))
        except httpx.HTTPError as exc:
            raise RuntimeError(f"the LLM server at {url} failed: {type(exc).__name__}: {exc}") from exc
        result = answer.result()
        put_messages(self.outbox, speaker.say(result["text"], done=True))
        return result


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
