"""Running the app on hypercorn's trio worker, inside the caller's trio run and pipeline.

:func:`serve` binds the socket itself before anything else happens, so a busy port or a bad host
is a :class:`BindError` naming the address (never a silent switch to another port), and port 0
works: the bound port is what ``task_status.started`` reports. SIGINT/SIGTERM (or ``shutdown``
being set) starts a graceful drain: no new connections, in-flight requests get up to
``graceful_timeout`` seconds, then hypercorn cancels them, which aborts their pipeline requests. A
second signal during the drain cancels everything at once. Cancelling the caller stops at once.
Listening beyond loopback without API keys logs a warning that anyone who can reach the port may
use the server.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import signal
import socket
from collections.abc import Iterable, Sequence
from typing import Any

import hypercorn.trio
import trio
from hypercorn.config import Config

from omnitrio.config import PipelineConfig
from omnitrio.serve.app import create_app
from omnitrio.serve.auth import ApiKeys
from omnitrio.serve.connections import contain_connection_errors
from omnitrio.serve.context import DEFAULT_LEAD, DEFAULT_REQUEST_TIMEOUT_S, ServedPipeline
from omnitrio.serve.limits import ServeLimits, limits_for

log = logging.getLogger("omnitrio.serve")


class BindError(OSError):
    """The server cannot listen where it was asked to; the message says where and why."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound, not yet listening, TCP socket for ``host:port`` (``port=0``: any free port)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise BindError(f"cannot listen on {host}:{port}: unknown host ({exc.strerror})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        hint = "; the port is in use, choose another with --port" if exc.errno == errno.EADDRINUSE else ""
        raise BindError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}{hint}") from None
    return sock


async def serve(
    pipeline: ServedPipeline,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    graceful_timeout: float = 5.0,
    shutdown: trio.Event | None = None,
    handle_signals: bool = True,
    max_body_bytes: int | None = None,
    request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT_S,
    limits: ServeLimits | None = None,
    api_keys: ApiKeys | Iterable[str] = (),
    public_metrics: bool = False,
    allowed_origins: Sequence[str] = (),
    serves: Iterable[str] | None = None,
    realtime_audio_lead: float = DEFAULT_LEAD,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``pipeline`` over HTTP and WebSocket until a signal or ``shutdown``, then drain and return.

    Call it inside the pipeline's context (``async with open_pipeline(...) as p: await serve(p)``);
    the pipeline outlives the server, so every request is aborted before the pipeline closes.
    ``handle_signals`` needs the main thread; pass False (and a ``shutdown`` event) elsewhere.
    ``limits`` default to :func:`~.limits.limits_for` the pipeline's config; ``request_timeout`` is every pipeline
    request's deadline; the other options are :func:`~.app.create_app`'s.
    ``realtime_audio_lead``: seconds of audio a realtime client is sent ahead of real time.
    """
    if limits is None:
        config_of = getattr(pipeline, "config", None)
        limits = limits_for(config_of if isinstance(config_of, PipelineConfig) else None)
    keys = api_keys if isinstance(api_keys, ApiKeys) else ApiKeys(tuple(api_keys))
    sock = bind_socket(host, port)
    bound_port: int = sock.getsockname()[1]
    warning = unguarded_warning(sock.getsockname()[0], keys)
    if warning is not None:
        log.warning("%s:%d: %s", host, bound_port, warning)
    contain_connection_errors()
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn takes ownership of the descriptor
    config.graceful_timeout = graceful_timeout
    # hypercorn logs through the caller's logging only, with no stderr handler of its own.
    config.errorlog = logging.getLogger("hypercorn.error")
    # The realtime route refuses an event past max_event_bytes with an error event and a 1009 that
    # says why; hypercorn's own cap (a bare 1009) only stops what is far beyond it from being buffered.
    config.websocket_max_message_size = 2 * limits.max_event_bytes
    stop = shutdown if shutdown is not None else trio.Event()
    app = create_app(
        pipeline,
        max_body_bytes=max_body_bytes,
        request_timeout=request_timeout,
        limits=limits,
        api_keys=keys,
        public_metrics=public_metrics,
        allowed_origins=allowed_origins,
        serves=serves,
        realtime_audio_lead=realtime_audio_lead,
        webrtc_hosts=(host,),
    )
    async with trio.open_nursery() as nursery:
        if handle_signals:
            await nursery.start(_drain_on_signals, stop, nursery.cancel_scope, graceful_timeout)
        await nursery.start(_run_hypercorn, app, config, stop, nursery.cancel_scope)
        log.info("serving %r on http://%s:%d", pipeline.name, host, bound_port)
        task_status.started(bound_port)


def unguarded_warning(address: str, keys: ApiKeys) -> str | None:
    """The warning to give when the server listens at ``address`` (an IP) beyond loopback with no key."""
    try:
        loopback = ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        loopback = False
    if keys or loopback:
        return None
    return (
        "serving beyond loopback without an API key: anyone who can reach this port can use the server "
        "(set --api-key or OMNITRIO_API_KEY)"
    )


async def _run_hypercorn(
    app: Any, config: Config, stop: trio.Event, done: trio.CancelScope, *, task_status: trio.TaskStatus[list[str]]
) -> None:
    await hypercorn.trio.serve(app, config, shutdown_trigger=stop.wait, task_status=task_status)
    done.cancel()  # the server has drained: stop watching signals


async def _drain_on_signals(
    stop: trio.Event, everything: trio.CancelScope, graceful_timeout: float, *, task_status: trio.TaskStatus[None]
) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for signum in signals:
            if stop.is_set():
                log.warning("%s again: stopping now", signal.Signals(signum).name)
                everything.cancel()
                return
            log.info("%s: draining for up to %g s", signal.Signals(signum).name, graceful_timeout)
            stop.set()
