"""Request timeline events: one recorder per process, buffered, written as JSON lines.

Every hop a request makes leaves a small event — ``(time, name, request id, stage, fields)``
— so that its timeline can be rebuilt afterwards and summarised per stage and per hop
(:mod:`omnitrio.trace`).  Recording is **off by default**: the runtime holds
``recorder: EventRecorder | None = None`` and guards each call with
``if recorder is not None``, which costs a few nanoseconds and creates nothing.

When on, each process owns one :class:`EventRecorder` writing
``<dir>/events_<process>_<pid>.jsonl``.  What a caller may rely on:

- **Clock.** ``t_ns`` is ``time.monotonic_ns()`` — Linux ``CLOCK_MONOTONIC``, one clock
  for every process on the machine — so times from different processes' files are
  directly comparable and a cross-process hop is ``receiver.t_ns - sender.t_ns``.
- **Order.** Events of one recorder are written in the order they were emitted.
- **Cost.** :meth:`EventRecorder.emit` appends to a list; encoding and the one ``write``
  happen in a batch when the buffer holds ``max_buffered`` events, when
  ``flush_interval`` has passed since the last flush (checked at the next emit), on
  :meth:`~EventRecorder.flush`, on :meth:`~EventRecorder.close` and at interpreter exit.
- **Never fails a request.** ``emit`` does not raise for odd field values (anything JSON
  cannot hold is written as ``str(value)``, at flush time — so pass immutable values);
  a failed write is logged and that batch dropped.
- **Threads.** A recorder belongs to one thread (its process's trio thread).

The coordinator's hook ``on_event(request_id, name, fields)`` fits
:meth:`EventRecorder.coordinator_event` directly; :func:`combine_hooks` feeds one event
stream to several consumers (the recorder and :class:`omnitrio.metrics.PipelineMetrics`).
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import trio

log = logging.getLogger(__name__)

EVENT_DIR_ENV = "OMNITRIO_EVENT_DIR"
"""Set to a directory to turn recording on; spawned stage processes inherit it."""

FILE_PATTERN = "events_*.jsonl"
DEFAULT_MAX_BUFFERED = 4096
DEFAULT_FLUSH_INTERVAL = 1.0

EventHook = Callable[[str, str, dict[str, Any]], None]
"""The coordinator's ``on_event(request_id, name, fields)`` signature."""

# Stage-side event names (emitted with ``stage`` set).
STAGE_INPUT_RECEIVED = "stage_input_received"  # from_stage, kind: submit|payload|chunk
STAGE_DISPATCH = "stage_dispatch"
STAGE_COMPLETE = "stage_complete"  # terminal, next
STAGE_HOP_SENT = "stage_hop_sent"  # to_stage, transport: local|ipc
STAGE_FIRST_STREAM_CHUNK_SENT = "stage_first_stream_chunk_sent"  # to
STAGE_FAILED = "stage_failed"  # error_type
STAGE_ABORTED = "stage_aborted"
# Coordinator-side event names (emitted with ``stage`` None).
REQUEST_SUBMITTED = "request_submitted"
FIRST_STREAM_CHUNK = "first_stream_chunk"  # from_stage, modality
TERMINAL_RESPONSE = "terminal_response"  # from_stage
REQUEST_FAILED = "request_failed"  # stage, error_type, message (a stage's failure)
REQUEST_INVALID = "request_invalid"  # stage, error_type, message, code (the caller's mistake)
REQUEST_ABORTED = "request_aborted"  # reason
REQUEST_REJECTED = "request_rejected"  # reason
# Start-up event names (request id None; ``stage`` set for one stage's, else None).  A stage process
# emits its own, the caller's process those of its inline stages and of the processes it starts.
PROCESS_SPAWNED = "process_spawned"  # process, how: spawn|forkserver|ray (the caller, as it starts one)
FORK_SERVER_UP = "fork_server_up"  # the fork server's first line of Python ran
FORK_SERVER_PRELOADED = "fork_server_preloaded"  # modules, failed: its preload is done
PROCESS_INTERPRETER_UP = "process_interpreter_up"  # the stage process's first line of Python ran
PROCESS_RUNTIME_IMPORTED = "process_runtime_imported"  # omnitrio's own modules imported
PROCESS_LISTENING = "process_listening"  # its socket bound and its peers named
PROCESS_FACTORIES_IMPORTED = "process_factories_imported"  # every factory its stages name imported
STAGE_BUILD_BEGAN = "stage_build_began"
STAGE_BUILT = "stage_built"  # the factory returned its scheduler (models loaded)
STAGE_WARM = "stage_warm"  # warmed: what the scheduler says it warmed; the stage serves
PROCESS_READY = "process_ready"  # process (the stage process, as it says so; the caller, as it hears it)
PIPELINE_READY = "pipeline_ready"  # open_pipeline yields

_clock = time.monotonic_ns
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


class Event(msgspec.Struct, frozen=True):
    """One line of an events file."""

    t_ns: int
    event: str
    request_id: str | None
    stage: str | None = None
    fields: dict[str, Any] = {}
    process: str = ""
    pid: int = 0


def _encode_unknown(value: Any) -> Any:
    return str(value)


_encoder = msgspec.json.Encoder(enc_hook=_encode_unknown)


class EventRecorder:
    """Collects this process's events; writes them to ``path``, or keeps them in :attr:`events`.

    Use :func:`open_recorder` (a file per process) or :meth:`in_memory` (tests, one process).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        process: str = "main",
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
    ) -> None:
        if max_buffered < 1:
            raise ValueError(f"max_buffered must be >= 1, got {max_buffered}")
        if not flush_interval > 0:
            raise ValueError(f"flush_interval must be > 0 seconds, got {flush_interval}")
        self.path = None if path is None else Path(path)
        self.process = process
        self.pid = os.getpid()
        self.events: list[Event] = []
        """Everything emitted so far, for an in-memory recorder (``path`` None); flushed events only."""
        self._buffer: list[Event] = []
        self._max_buffered = max_buffered
        self._interval_ns = int(flush_interval * 1e9)
        self._flush_due = _clock() + self._interval_ns
        self._file: BinaryIO | None = None
        self._closed = False
        if self.path is not None:
            self._file = open(self.path, "ab")
            atexit.register(self.close)

    @classmethod
    def in_memory(cls, *, process: str = "main") -> EventRecorder:
        """A recorder that keeps events in :attr:`events` (after :meth:`flush`) instead of a file."""
        return cls(None, process=process)

    def emit(self, request_id: str | None, stage: str | None, name: str, /, **fields: Any) -> None:
        """Record ``name`` for ``request_id`` at ``stage`` (None: the coordinator), now."""
        t = _clock()
        buffer = self._buffer
        buffer.append(Event(t, name, request_id, stage, fields, self.process, self.pid))
        if len(buffer) >= self._max_buffered or t >= self._flush_due:
            self.flush()

    def emit_at(self, t_ns: int, request_id: str | None, stage: str | None, name: str, /, **fields: Any) -> None:
        """:meth:`emit` for something that happened at ``t_ns`` (``time.monotonic_ns()``), before now."""
        self._buffer.append(Event(t_ns, name, request_id, stage, fields, self.process, self.pid))
        if len(self._buffer) >= self._max_buffered:
            self.flush()

    def coordinator_event(self, request_id: str, name: str, fields: dict[str, Any]) -> None:
        """The coordinator's ``on_event`` hook: record a coordinator event (``stage`` None)."""
        t = _clock()
        buffer = self._buffer
        buffer.append(Event(t, name, request_id, None, fields, self.process, self.pid))
        if len(buffer) >= self._max_buffered or t >= self._flush_due:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered (one ``write``); logs and drops the batch if that fails."""
        buffer, self._buffer = self._buffer, []
        self._flush_due = _clock() + self._interval_ns
        if not buffer or self._closed:
            return
        if self._file is None:
            self.events.extend(buffer)
            return
        try:
            self._file.write(_encoder.encode_lines(buffer))
            self._file.flush()
        except (OSError, TypeError, ValueError) as exc:
            log.warning("events: dropped %d events, could not write %s: %r", len(buffer), self.path, exc)

    def close(self) -> None:
        """Flush and close the file; idempotent. Later emits are dropped."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._buffer = []
        self._max_buffered = 1  # later emits flush (and drop) at once instead of piling up
        if self._file is not None:
            atexit.unregister(self.close)
            try:
                self._file.close()
            except OSError as exc:
                log.warning("events: could not close %s: %r", self.path, exc)
            self._file = None

    def __enter__(self) -> EventRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def event_file(directory: str | os.PathLike[str], process: str, pid: int | None = None) -> Path:
    """``<directory>/events_<process>_<pid>.jsonl``; characters unsafe in a file name become ``_``."""
    if not process:
        raise ValueError("event recorder: the process name must not be empty")
    safe = _SAFE_NAME.sub("_", process)
    return Path(directory) / f"events_{safe}_{os.getpid() if pid is None else pid}.jsonl"


def open_recorder(directory: str | os.PathLike[str], process: str, **options: Any) -> EventRecorder:
    """A recorder for this process writing into ``directory`` (created if missing)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    return EventRecorder(event_file(directory, process), process=process, **options)


def recorder_from_env(process: str) -> EventRecorder | None:
    """A recorder when :data:`EVENT_DIR_ENV` names a directory, else None (recording off)."""
    directory = os.environ.get(EVENT_DIR_ENV)
    if not directory:
        return None
    return open_recorder(directory, process)


def combine_hooks(*hooks: EventHook | None) -> EventHook | None:
    """One ``on_event`` hook calling each given hook in order; None when none is given.

    ``coordinator.on_event = combine_hooks(metrics.on_event, recorder and recorder.coordinator_event)``
    """
    present = tuple(h for h in hooks if h is not None)
    match present:
        case ():
            return None
        case (only,):
            return only
        case _:

            def fan_out(request_id: str, name: str, fields: dict[str, Any]) -> None:
                for hook in present:
                    hook(request_id, name, fields)

            return fan_out


async def flush_periodically(recorder: EventRecorder, interval: float = DEFAULT_FLUSH_INTERVAL) -> None:
    """Flush ``recorder`` every ``interval`` seconds until cancelled, so an idle process's events reach disk.

    Run it in the process's nursery next to its stages; emits alone flush only when the next event comes.
    """
    while True:
        await trio.sleep(interval)
        recorder.flush()
