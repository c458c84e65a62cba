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
when the engine reports them, ``output_token_ids``; with ``return_hidden_states`` (the engine needs
``enable_return_hidden_states=True``) also ``hidden_states``, ``[generated, dim]`` float32 as
:class:`ARScheduler` gives them.  An engine-side abort (``finish_reason`` type ``"abort"``) is an
``error``.  ``abort(rid)`` cancels the stream and calls the engine's ``abort_request(rid=...)`` (or
its tokenizer manager's) on the engine's loop.

``Engine.shutdown()`` kills every child process of the process it runs in, so an SGLang stage wants
a process of its own (``process = "..."`` in the config).  :func:`shut_down` removes what the
engine's processes leave in ``/dev/shm``.  Proven with sglang 0.5.23 on CPU
(``tests/test_sglang_engine.py``).

``sglang`` is imported only by :func:`create_sglang_scheduler` and :func:`preflight`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import importlib.util
import inspect
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch

from omnitrio.contract import IncomingMessage, OutgoingMessage, StageOverloaded, StagePayload
from schedulers.ar.scheduler import prompt_and_params
from schedulers.engine.step_loop import STOP, Mailboxes, Stop

# SGLang's shutdown waits up to 60 s for its killed children; then /dev/shm is cleaned.
SHUTDOWN_TIMEOUT = 90.0


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
            self._thread.join(timeout=SHUTDOWN_TIMEOUT)

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
            shut_down(self.engine)


def shut_down(engine: Any) -> None:
    """Shut ``engine`` down and remove the shared-memory files its processes leave in ``/dev/shm``.

    SGLang's ``shutdown()`` SIGKILLs the engine's child processes, so what they registered for
    cleanup at exit stays behind: the scheduler's load snapshot (``sglang_loads_*.shm``) and the
    named semaphores of locks created there (``sem.mp-*``).  The files removed are exactly those
    the engine's own children have mapped just before the shutdown, found in ``/proc/PID/maps``.
    When ``shutdown()`` fails, the children it did not reap (still this process's children, so
    their ids cannot have been reused) are killed.
    """
    pids = _child_pids(engine)
    files = {path for pid in pids for path in _mapped_shm(pid)}
    try:
        shutdown = getattr(engine, "shutdown", None)
        if shutdown is not None:
            shutdown()
    except BaseException:
        for pid in pids:
            if _parent_of(pid) == os.getpid():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        raise
    finally:
        for path in files:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _child_pids(engine: Any) -> list[int]:
    child_pids = getattr(engine, "get_all_child_pids", None)
    if child_pids is None:
        return []
    try:
        return [int(pid) for pid in child_pids()]
    except Exception:  # an engine that did not finish starting has no children to list
        return []


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])


_LEFT_BEHIND = ("sglang_loads_", "sem.mp-")


def _mapped_shm(pid: int) -> set[Path]:
    """The files in ``/dev/shm`` SGLang leaves behind that process ``pid`` has mapped.

    Matched by inode, not by the name in ``maps``: glibc's ``sem_open`` maps a temporary file and
    links it to the semaphore's name, so ``maps`` shows the deleted temporary name.
    """
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return set()
    inodes = set()
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith(f"{SHM}/"):
            inodes.add(int(fields[4]))
    if not inodes:
        return set()
    with os.scandir(SHM) as entries:
        return {Path(e.path) for e in entries if e.name.startswith(_LEFT_BEHIND) and e.inode() in inodes}


SHM = Path("/dev/shm")


@attrs.define(eq=False)
class _Pending:
    payload: StagePayload
    streams: bool
    arguments: dict[str, Any]


class SGLangScheduler(Mailboxes):
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
        super().__init__()
        self._engine_thread = EngineThread(engine_factory)
        self._started = False
        self.max_running_requests = max_running_requests
        self.max_waiting_requests = max_waiting_requests
        self.default_max_new_tokens = default_max_new_tokens
        self.stream = stream
        # Owned by the engine loop:
        self._running: dict[str, asyncio.Task[None]] = {}
        self._waiting: collections.OrderedDict[str, _Pending] = collections.OrderedDict()

    @property
    def engine(self) -> Any:
        return self._engine_thread.engine

    @property
    def num_waiting(self) -> int:
        """Requests accepted but waiting for a running slot (readable from any thread)."""
        return len(self._waiting)

    def warm_up_serving_thread(self) -> None:
        """Start the engine (model load: slow) before the stage reports ready."""
        if not self._started:
            self._started = True
            self._engine_thread.start()

    def start(self) -> None:
        """Hand inbox messages to the engine loop until :meth:`stop`; then shut the engine down."""
        self.warm_up_serving_thread()
        try:
            while not isinstance(message := self._inbox.get(), Stop):
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
        if params.get("return_hidden_states"):
            arguments["return_hidden_states"] = True
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
        hidden = meta.pop("hidden_states", None)
        result: dict[str, Any] = {"text": text, "finish_reason": reason, "meta_info": meta}
        if last is not None and "output_ids" in last:
            result["output_token_ids"] = list(last["output_ids"])
        if hidden:
            result["hidden_states"] = per_token_hidden_states(hidden)
        if isinstance(payload.data, dict):
            payload.data.update(result)
        else:
            payload.data = result
        return OutgoingMessage(rid, "result", payload)


def per_token_hidden_states(hidden: list[Any]) -> torch.Tensor:
    """SGLang's ``meta_info["hidden_states"]`` as ``[generated, dim]`` float32, one row per output token.

    SGLang lists the prefill's states for every prompt position (``[prompt, dim]``; the last one
    produced the first token), then one ``[dim]`` per decode step; :class:`ARScheduler` gives the
    state that produced each output token, so the prefill contributes its last row.
    """
    rows = [torch.as_tensor(step, dtype=torch.float32) for step in hidden]
    return torch.stack([row[-1] if row.dim() == 2 else row for row in rows])


def create_sglang_scheduler(
    model_path: str, *, scheduler_args: dict[str, Any] | None = None, **engine_args: Any
) -> SGLangScheduler:
    """Stage factory: ``sglang.Engine(model_path=..., **engine_args)`` behind :class:`SGLangScheduler`."""

    def build() -> Any:
        import sglang

        return sglang.Engine(model_path=model_path, **engine_args)

    return SGLangScheduler(build, **(scheduler_args or {}))


INSTALL_HINT = (
    "pip install 'omnitrio[sglang]' on a CUDA machine (sglang pins its own CUDA torch); "
    "for a CPU test engine: python -m tests.sglang_env setup"
)


def preflight(model_path: str, *, scheduler_args: dict[str, Any] | None = None, **engine_args: Any) -> None:
    """Check :func:`create_sglang_scheduler`'s arguments without starting anything.

    ``ModuleNotFoundError`` naming what to install when ``sglang`` is missing; ``ValueError`` naming
    engine arguments that ``sglang``'s ``ServerArgs`` does not have, or scheduler arguments that
    :class:`SGLangScheduler` does not take.
    """
    takes = set(inspect.signature(SGLangScheduler).parameters) - {"engine_factory"}
    unknown = sorted(set(scheduler_args or {}) - takes)
    if unknown:
        raise ValueError(f"scheduler_args: SGLangScheduler does not take {unknown}; it takes {sorted(takes)}")
    if importlib.util.find_spec("sglang") is None:
        raise ModuleNotFoundError(f"needs the `sglang` package, which is not installed here: {INSTALL_HINT}")
    import sglang
    from sglang.srt.server_args import ServerArgs

    # A msgspec Struct in sglang 0.5.23, a dataclass before.
    fields = getattr(ServerArgs, "__struct_fields__", None) or [f.name for f in dataclasses.fields(ServerArgs)]
    unknown = sorted(set(engine_args) - set(fields))
    if unknown:
        raise ValueError(f"sglang {sglang.__version__}: Engine does not take {unknown} (not in ServerArgs)")


create_sglang_scheduler.preflight = preflight  # type: ignore[attr-defined]
