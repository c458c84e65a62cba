"""``SGLangScheduler``: the AR scheduler interface over an SGLang ``Engine`` (optional extra ``sglang``).

SGLang's offline ``Engine`` binds to the asyncio loop it was created on and hangs when streamed from
another, so the engine lives in a thread of its own that owns one asyncio loop: the engine is built
there, every call to it runs there, and nothing else touches it.  The scheduler thread (``start()``)
only reads the inbox and hands each message to that loop with ``call_soon_threadsafe``; all request
state lives on the loop.  SGLang does its own continuous batching; this adapter bounds how many
requests it has in flight (``max_running_requests``) and how many wait (``max_waiting_requests``;
full → ``error`` with :class:`~omnitrio.contract.StageOverloaded`), like :class:`ARScheduler`.

Formats, compared with :class:`~schedulers.ar.scheduler.ARScheduler`: the same ``new_request`` payload
and params (``ignore_eos`` is passed as SGLang's own sampling param).  Because SGLang detokenizes
itself, ``stream`` outputs carry text: ``data={"text": delta}``, ``metadata={"modality": "text"}``
(the engine's cumulative ``text`` turned into deltas).  The ``result`` payload's ``data`` gets
``text``, ``finish_reason`` (the type of SGLang's ``meta_info["finish_reason"]``), ``meta_info`` and,
when the engine reports them, ``output_token_ids``.  An engine-side abort (``finish_reason`` type
``"abort"``) is an ``error``.  ``abort(rid)`` cancels the stream and calls the engine's
``abort_request(rid=...)`` (or its tokenizer manager's) on the engine's loop.

``sglang`` is imported only by :func:`create_sglang_scheduler`.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
from collections.abc import Callable
from typing import Any

import attrs

from omnitrio.contract import IncomingMessage, OutgoingMessage, StageOverloaded, StagePayload
from schedulers.ar.scheduler import prompt_and_params
from schedulers.ar.step_loop import STOP, _Stop


class EngineThread:
    """A thread running one asyncio loop that owns the engine ``factory()`` builds on it."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.engine: Any = None
        self._closed: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="sglang-engine", daemon=True)

    def start(self) -> None:
        """Build the engine on the thread's loop; blocks until it is ready, re-raising its failure."""
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise RuntimeError(f"SGLang engine failed to start: {self._error!r}") from self._error

    def call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(fn, *args)

    def close(self) -> None:
        """Cancel what runs on the loop, shut the engine down and join the thread."""
        if self.loop is not None and self._closed is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._closed.set)
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._closed = asyncio.Event()
        try:
            self.engine = self._factory()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            await self._closed.wait()
        finally:
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            shutdown = getattr(self.engine, "shutdown", None)
            if shutdown is not None:
                shutdown()


@attrs.define(eq=False)
class _Pending:
    payload: StagePayload
    streams: bool
    arguments: dict[str, Any]


class SGLangScheduler:
    """Stage scheduler over an SGLang-like engine; see the module docstring for formats and threads."""

    def __init__(
        self,
        engine_factory: Callable[[], Any],
        *,
        max_running_requests: int = 64,
        max_waiting_requests: int = 256,
        default_max_new_tokens: int = 64,
        stream: bool | None = None,
    ) -> None:
        self._engine_thread = EngineThread(engine_factory)
        self._started = False
        self.max_running_requests = max_running_requests
        self.max_waiting_requests = max_waiting_requests
        self.default_max_new_tokens = default_max_new_tokens
        self.stream = stream
        self._inbox: queue.Queue[IncomingMessage | _Stop] = queue.Queue()
        self._outbox: queue.Queue[OutgoingMessage] = queue.Queue()
        # Owned by the engine loop:
        self._running: dict[str, asyncio.Task[None]] = {}
        self._waiting: collections.OrderedDict[str, _Pending] = collections.OrderedDict()

    @property
    def inbox(self) -> queue.Queue[IncomingMessage | _Stop]:
        return self._inbox

    @property
    def outbox(self) -> queue.Queue[OutgoingMessage]:
        return self._outbox

    @property
    def engine(self) -> Any:
        return self._engine_thread.engine

    def warm_up_serving_thread(self) -> None:
        """Start the engine (model load: slow) before the stage reports ready."""
        if not self._started:
            self._started = True
            self._engine_thread.start()

    def start(self) -> None:
        """Hand inbox messages to the engine loop until :meth:`stop`; then shut the engine down."""
        self.warm_up_serving_thread()
        try:
            while not isinstance(message := self._inbox.get(), _Stop):
                self._engine_thread.call_soon(self._on_message, message)
        finally:
            self._engine_thread.close()

    def stop(self) -> None:
        self._inbox.put(STOP)

    def abort(self, request_id: str) -> None:
        self._inbox.put(IncomingMessage(request_id, "abort"))

    # ---- on the engine loop ----

    def _on_message(self, message: IncomingMessage) -> None:
        rid = message.request_id
        match message.type:
            case "new_request":
                try:
                    pending = self._parse(message)
                except ValueError as exc:
                    self._outbox.put(OutgoingMessage(rid, "error", exc))
                    return
                if len(self._running) < self.max_running_requests:
                    self._launch(rid, pending)
                elif len(self._waiting) < self.max_waiting_requests:
                    self._waiting[rid] = pending
                else:
                    overloaded = StageOverloaded(
                        f"SGLang scheduler: waiting queue is full ({len(self._waiting)} waiting, "
                        f"max_waiting_requests={self.max_waiting_requests}); request {rid!r} rejected"
                    )
                    self._outbox.put(OutgoingMessage(rid, "error", overloaded))
            case "abort":
                self._abort(rid)
            case "stream_chunk" | "stream_done":
                self._abort(rid)
                error = ValueError(f"SGLangScheduler does not accept stream input ({message.type} for {rid!r})")
                self._outbox.put(OutgoingMessage(rid, "error", error))

    def _parse(self, message: IncomingMessage) -> _Pending:
        prompt, params = prompt_and_params(message.data)
        max_new_tokens = int(params.get("max_new_tokens", self.default_max_new_tokens))
        if max_new_tokens < 1:
            raise ValueError(f"request {message.request_id!r}: max_new_tokens={max_new_tokens} must be >= 1")
        sampling: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "temperature": float(params.get("temperature", 0)),
        }
        if params.get("ignore_eos"):
            sampling["ignore_eos"] = True
        arguments: dict[str, Any] = {"sampling_params": sampling, "stream": True, "rid": message.request_id}
        if isinstance(prompt, str):
            arguments["prompt"] = prompt
        else:
            arguments["input_ids"] = prompt
        streams = self.stream if self.stream is not None else bool(params.get("stream", False))
        return _Pending(message.data, streams, arguments)

    def _launch(self, rid: str, pending: _Pending) -> None:
        loop = asyncio.get_running_loop()
        self._running[rid] = loop.create_task(self._generate(rid, pending))

    def _abort(self, rid: str) -> None:
        if self._waiting.pop(rid, None) is not None:
            return
        task = self._running.pop(rid, None)
        if task is None:
            return
        task.cancel()
        engine = self.engine
        abort = getattr(engine, "abort_request", None) or engine.tokenizer_manager.abort_request
        abort(rid=rid)
        self._admit_next()

    def _admit_next(self) -> None:
        while self._waiting and len(self._running) < self.max_running_requests:
            rid, pending = self._waiting.popitem(last=False)
            self._launch(rid, pending)

    async def _generate(self, rid: str, pending: _Pending) -> None:
        try:
            outputs = await self.engine.async_generate(**pending.arguments)
            text, last = "", None
            async for out in outputs:
                cumulative = out["text"]
                delta, text, last = cumulative[len(text) :], cumulative, out
                if pending.streams and delta:
                    self._outbox.put(OutgoingMessage(rid, "stream", {"text": delta}, metadata={"modality": "text"}))
            self._outbox.put(self._result(rid, pending.payload, text, last))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._outbox.put(OutgoingMessage(rid, "error", exc))
        finally:
            if self._running.get(rid) is asyncio.current_task():
                del self._running[rid]
                self._admit_next()

    def _result(self, rid: str, payload: StagePayload, text: str, last: dict[str, Any] | None) -> OutgoingMessage:
        meta = dict(last["meta_info"]) if last is not None else {}
        finish = meta.get("finish_reason")
        reason = finish.get("type") if isinstance(finish, dict) else finish
        if reason == "abort":
            message = finish.get("message") if isinstance(finish, dict) else None
            return OutgoingMessage(rid, "error", RuntimeError(f"SGLang aborted request {rid!r}: {message}"))
        result: dict[str, Any] = {"text": text, "finish_reason": reason, "meta_info": meta}
        if last is not None and "output_ids" in last:
            result["output_token_ids"] = list(last["output_ids"])
        if isinstance(payload.data, dict):
            payload.data.update(result)
        else:
            payload.data = result
        return OutgoingMessage(rid, "result", payload)


def create_sglang_scheduler(
    model_path: str, *, scheduler_args: dict[str, Any] | None = None, **engine_args: Any
) -> SGLangScheduler:
    """Stage factory: ``sglang.Engine(model_path=..., **engine_args)`` behind :class:`SGLangScheduler`."""

    def build() -> Any:
        import sglang

        return sglang.Engine(model_path=model_path, **engine_args)

    return SGLangScheduler(build, **(scheduler_args or {}))
