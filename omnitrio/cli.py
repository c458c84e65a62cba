"""``python -m omnitrio``: serve a pipeline, run one request, check or trace a config.

::

    python -m omnitrio serve [--config FILE] [--model PATH] [--device cuda] [--dtype bfloat16] [--host 127.0.0.1]
                             [--port 8000] [--set k=v ...] [--api-key KEY ...] [--allowed-origin URL ...]
                             [--limit NAME=VALUE ...]
    python -m omnitrio run [--config FILE] [--device D] [--dtype T] [--set k=v ...] [--audio-out FILE.wav] INPUT
    python -m omnitrio check [--model PATH] [--device D] [--dtype T] [--set k=v ...] [FILE]
    python -m omnitrio tiny-model FAMILY DIR [--size tiny|medium] [--seed N]
    python -m omnitrio trace ...            (omnitrio.trace, when it is installed)

Without ``--config``, ``serve`` and ``run`` use the default pipeline: ``configs/speech.toml`` next to
the ``omnitrio`` package (the repository checkout an editable install points at). ``--model PATH``
without ``--config`` (``serve``, ``check``) picks the pipeline from what PATH is
(:func:`omnitrio.families.config_for_model`): a checkpoint directory its family's config by
``config.json``'s ``model_type``, a ``.gguf`` file the default pipeline; anything else is a config
error naming what was found and what is served. The server listens
on loopback unless told otherwise; a busy port is an error that names the address (checked before
any model loads, never a silent switch to another port). SIGINT or SIGTERM drains in-flight requests
and exits 0. Exit codes: 0 success, 1 the request or the server failed, 2 bad usage or config.
``tiny-model`` writes a random checkpoint of a served model family (:mod:`omnitrio.families`) and
prints the command that serves it.

Who may use the server: with ``--api-key`` (repeatable) or ``OMNITRIO_API_KEY`` (keys separated by
commas), every ``/v1/*`` route needs ``Authorization: Bearer KEY`` (:mod:`omnitrio.serve.auth`);
listening beyond loopback without a key logs a warning. ``--allowed-origin`` turns CORS on for those
origins. ``--limit`` sets one of the server's limits (:mod:`omnitrio.serve.limits`); ``check`` prints
them with the values the pipeline gets.

``--device`` / ``--dtype`` place every model stage: they set ``device`` / ``dtype`` on each stage whose
factory takes that argument (:func:`omnitrio.config_loading.apply_placement`); a stage's own
``--set STAGE.factory.device=...`` wins.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import traceback
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import trio

from omnitrio.config import PipelineConfig
from omnitrio.config_loading import load, process_factory_paths
from omnitrio.errors import ConfigError, StartupError
from omnitrio.families import FAMILIES, SIZES, config_for_model, write_tiny_model
from omnitrio.importing import import_object

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "speech.toml"
log = logging.getLogger("omnitrio.cli")


class UsageError(Exception):
    """Bad command-line input; printed as ``omnitrio: error: ...`` with exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m omnitrio",
        description="Serve multi-stage omni model pipelines (speech, text, audio) on trio.",
        epilog="Without --config, serve and run use the default offline speech pipeline "
        f"({DEFAULT_CONFIG}). Each command has its own --help.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def overrides(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override one config field, e.g. --set asr.factory.cpu_threads=1 (repeatable)",
        )
        sub.add_argument(
            "--device",
            metavar="DEVICE",
            help="where every model stage computes: cpu, cuda or cuda:N (sets the device argument of each "
            "stage whose factory takes one; --set STAGE.factory.device=... wins; default: the config's)",
        )
        sub.add_argument(
            "--dtype",
            choices=["float32", "bfloat16", "float16"],
            help="the dtype every model stage computes in, as --device (default: the config's)",
        )

    serve = commands.add_parser(
        "serve",
        help="serve a pipeline over the OpenAI-compatible HTTP and realtime WebSocket API",
        description="Serve a pipeline: /v1/chat/completions, /v1/audio/speech, /v1/audio/transcriptions, "
        "WS /v1/realtime, /health, /metrics. Ctrl-C drains in-flight requests and exits.",
    )
    serve.add_argument("--config", type=Path, help="pipeline TOML file (default: the offline speech pipeline)")
    serve.add_argument(
        "--model",
        type=Path,
        metavar="PATH",
        help="the model to serve: a checkpoint directory (without --config, its config.json's model_type picks "
        "the pipeline) or a .gguf file (the default pipeline's responder); it fills the config's model_args",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s, loopback)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port (default: %(default)s; 0: any free port)")
    serve.add_argument(
        "--graceful-timeout", type=float, default=5.0, help="seconds in-flight requests get on shutdown (default: 5)"
    )
    serve.add_argument(
        "--request-timeout",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="deadline of each request; past it the client gets a timeout error (default: the config's "
        "default_timeout, else the server's 300; 0: none)",
    )
    serve.add_argument(
        "--placement",
        choices=["local", "ray"],
        help="where process groups run: child processes (local) or Ray actors (default: the config's)",
    )
    serve.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="with --placement ray: the Ray cluster to join (default: start a loopback-only local one)",
    )
    overrides(serve)
    serve.add_argument(
        "--api-key",
        dest="api_keys",
        action="append",
        default=[],
        metavar="KEY",
        help="require this key (Authorization: Bearer KEY) on /v1/* (repeatable; also OMNITRIO_API_KEY, "
        "comma-separated, which keeps keys out of the process list)",
    )
    serve.add_argument(
        "--public-metrics", action="store_true", help="serve /metrics without a key even when keys are set"
    )
    serve.add_argument(
        "--allowed-origin",
        dest="allowed_origins",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let browser pages from this origin use the server (CORS; e.g. https://app.example; '*' for any; "
        "repeatable; default: none)",
    )
    serve.add_argument(
        "--limit",
        dest="limits",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set one server limit, e.g. --limit max_realtime_sessions=8 (repeatable; 'check' lists them)",
    )

    run = commands.add_parser(
        "run",
        help="run one request from the shell and print its streamed output",
        description="Submit INPUT to the pipeline and print what it streams, one line per chunk (text as a JSON "
        "string, so its spaces show), then the result as JSON. "
        'INPUT is JSON when it parses as JSON (e.g. \'{"task": "speech", "input": "Hello."}\'), '
        "otherwise a plain string; '-' reads it from stdin.",
    )
    run.add_argument("--config", type=Path, help="pipeline TOML file (default: the offline speech pipeline)")
    run.add_argument(
        "--audio-out",
        type=Path,
        metavar="FILE.wav",
        help="also write the audio (streamed, or the result's 'audio') to a WAV file; exit 1, saying so, "
        "when the pipeline sent none",
    )
    run.add_argument("--timeout", type=float, default=None, help="deadline of the request in seconds")
    overrides(run)
    run.add_argument("input", metavar="INPUT", help="the request inputs (JSON or text; '-' for stdin)")

    check = commands.add_parser(
        "check",
        help="validate a config and print its stage graph",
        description="Load and validate a pipeline file (importing every factory and function it names) "
        "and print its stages and edges. Exit 0 when valid, 2 with the error otherwise (a stage that "
        "needs a package not installed here included).",
    )
    check.add_argument(
        "file",
        type=Path,
        nargs="?",
        metavar="FILE",
        help="pipeline TOML file (default: the one --model picks, else the default pipeline)",
    )
    check.add_argument(
        "--model",
        type=Path,
        metavar="PATH",
        help="as serve's --model; stages that can check it (files, not weights) do",
    )
    overrides(check)

    tiny = commands.add_parser(
        "tiny-model",
        help="write a tiny random checkpoint of a model family, to try its pipeline without weights",
        description="Write a random checkpoint laid out as the family's released one (config, shards, "
        "tokenizer, processor files), small enough to answer on a CPU in seconds, and print the serve "
        "command for it. The same --seed writes the same weights.",
    )
    tiny.add_argument("family", choices=sorted(FAMILIES), metavar="FAMILY", help=f"one of {sorted(FAMILIES)}")
    tiny.add_argument("directory", type=Path, metavar="DIR", help="where to write it (created)")
    tiny.add_argument("--size", choices=SIZES, default="tiny", help="tiny (default) or medium (a few M parameters)")
    tiny.add_argument("--seed", type=int, default=0, help="the weights' seed (default: 0)")

    trace = commands.add_parser(
        "trace",
        help="request timelines of a pipeline (omnitrio.trace)",
        description="Arguments after 'trace' go to omnitrio.trace; run 'python -m omnitrio trace --help'.",
        add_help=False,
    )
    trace.add_argument("args", nargs=argparse.REMAINDER, help="arguments for omnitrio.trace")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The console entry point; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["trace"]:
        return _trace(argv[1:])  # every argument, options included, belongs to omnitrio.trace
    args = build_parser().parse_args(argv)
    try:
        match args.command:
            case "serve":
                return _serve(args)
            case "run":
                return _run(args)
            case "check":
                return _check(args)
            case "tiny-model":
                return _tiny_model(args)
            case "trace":
                return _trace(args.args)
    except (ConfigError, UsageError) as exc:
        print(f"omnitrio: error: {exc}", file=sys.stderr)
        return 2
    except StartupError as exc:
        print(startup_failure(exc), file=sys.stderr)
        return 1
    raise AssertionError(args.command)


def startup_failure(exc: StartupError) -> str:
    """One line naming the stage and the error, then the traceback of what raised it, once."""
    summary, _, details = str(exc).partition("\n")
    if not details and exc.__cause__ is not None:
        details = "".join(traceback.format_exception(exc.__cause__))
    return f"omnitrio: error: {summary}\n{details}".rstrip()


# -- config ------------------------------------------------------------------------------------


def load_config(
    path: Path | None,
    overrides: Sequence[str],
    model: Path | None = None,
    device: str | None = None,
    dtype: str | None = None,
    *,
    to_start: bool = False,
) -> PipelineConfig:
    """The pipeline at ``path`` pointed at ``model``, placed on ``device`` in ``dtype``, overridden,
    validated.  Without ``path``: the config ``model`` picks (:func:`~omnitrio.families.config_for_model`),
    else the default pipeline.  ``to_start``: the caller will start it, so the fork server of its stage
    processes starts before the config is loaded (:func:`omnitrio.start_method.start_fork_server_early`),
    and the factories of stages in processes of their own are checked there, not imported here."""
    if path is None and model is not None:
        path = config_for_model(model)
    if path is None:
        if not DEFAULT_CONFIG.is_file():
            raise UsageError(
                f"the default pipeline {DEFAULT_CONFIG} is missing (it ships in the repository's configs/; "
                "install omnitrio editable from a checkout, or pass --config FILE)"
            )
        path = DEFAULT_CONFIG
    if to_start:
        from omnitrio.start_method import start_fork_server_early

        start_fork_server_early(process_factory_paths(path, overrides))
    return load(path, overrides, model, device=device, dtype=dtype, process_factories=not to_start)


# -- check -------------------------------------------------------------------------------------


def _check(args: argparse.Namespace) -> int:
    from omnitrio.serve.limits import limits_for, session_stages

    config = load_config(args.file, args.overrides, args.model, args.device, args.dtype)
    print(describe(config))
    print(f"server limits (serve --limit NAME=VALUE):\n{limits_for(config).describe()}")
    stages = ", ".join(f"{name} max_sessions={limit}" for name, limit in session_stages(config).items())
    print(f"  (max_realtime_sessions follows the session stages: {stages or 'none'})")
    problems = preflight(config)
    for problem in problems:
        print(f"omnitrio: error: {problem}", file=sys.stderr)
    return 2 if problems else 0  # a config that cannot run here (a package missing) is a config error


def _tiny_model(args: argparse.Namespace) -> int:
    written = write_tiny_model(args.family, args.directory, size=args.size, seed=args.seed)
    print(f"wrote a {args.size} random {args.family} checkpoint to {written}")
    print(f"serve it: python -m omnitrio serve --model {written}")
    return 0


def preflight(config: PipelineConfig) -> list[str]:
    """What stage factories with a ``preflight(**factory_args)`` say about running here, one line each.

    A factory that needs an optional package (``sglang``, say) names what to install, and checks
    its arguments against that package when it is installed; the factory itself is not called.
    """
    problems = []
    for stage in config.stages:
        check = getattr(import_object(stage.factory_path), "preflight", None)
        if check is None:
            continue
        try:
            check(**stage.factory.to_kwargs())
        except Exception as exc:
            problems.append(f"stage {stage.name!r}: {exc}")
    return problems


def describe(config: PipelineConfig) -> str:
    """The stage graph as text: one stage per line with where its outputs go."""
    lines = [f"pipeline {config.name!r}: {len(config.stages)} stages, entry {config.entry_stage!r}"]
    if config.terminal_stages_fn:
        lines.append(f"  terminal stages per request: {config.terminal_stages_fn}")
    if config.serves is not None:
        lines.append(f"  serves: {', '.join(config.serves)}")
    width = max(len(stage.name) for stage in config.stages)
    for stage in config.stages:
        where = "[main]"
        if stage.process:
            copies = int(config.processes.get(stage.process, {}).get("replicas", 1))
            where = f"[{stage.process} x{copies}]" if copies > 1 else f"[{stage.process}]"
        edges = ["terminal"] if stage.terminal else [f"-> {', '.join(stage.next_stages)}"]
        if stage.route_fn:
            edges.append(f"route {stage.route_fn}")
        if stage.wait_for:
            edges.append(f"waits for {', '.join(stage.wait_for)} (merge {stage.merge_fn})")
        if stage.stream_to:
            edges.append(f"streams to {', '.join(stage.stream_to)}")
        lines.append(f"  {stage.name:<{width}}  {where:<8} {stage.factory_path}  {'; '.join(edges)}")
    return "\n".join(lines)


# -- serve -------------------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    from omnitrio.serve import BindError, bind_socket
    from omnitrio.serve.auth import keys_from
    from omnitrio.serve.limits import limits_for

    config = load_config(
        args.config, [*args.overrides, *placement_overrides(args)], args.model, args.device, args.dtype, to_start=True
    )
    try:
        args.api_keys = keys_from(args.api_keys, os.environ)
        args.limits = limits_for(config, args.limits)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    _log_to_stderr()
    try:
        bind_socket(args.host, args.port).close()  # fail on a busy port now, not after loading models
    except BindError as exc:
        print(f"omnitrio: error: {exc}", file=sys.stderr)
        return 1
    try:
        trio.run(_serve_async, config, args)
    except KeyboardInterrupt:
        print("omnitrio: interrupted while starting", file=sys.stderr)
        return 130
    except BindError as exc:
        print(f"omnitrio: error: {exc}", file=sys.stderr)
        return 1
    return 0


def placement_overrides(args: argparse.Namespace) -> list[str]:
    """``--placement``/``--ray-address`` as config overrides (an address implies Ray)."""
    found = []
    if args.placement is not None:
        found.append(f"placement={args.placement}")
    if args.ray_address is not None:
        if args.placement == "local":
            raise UsageError("--ray-address needs --placement ray")
        found += ["placement=ray", f'ray_address="{args.ray_address}"']
    return found


async def _serve_async(config: PipelineConfig, args: argparse.Namespace) -> None:
    from omnitrio.runner import open_pipeline
    from omnitrio.serve import serve
    from omnitrio.serve.context import DEFAULT_REQUEST_TIMEOUT_S

    names = ", ".join(stage.name for stage in config.stages)
    print(f"omnitrio: starting {config.name!r} ({names}); the first start loads models...", file=sys.stderr)
    started = time.perf_counter()
    async with open_pipeline(config) as pipeline:
        elapsed = time.perf_counter() - started
        print(f"omnitrio: pipeline ready in {elapsed:.1f} s", file=sys.stderr)

        async with trio.open_nursery() as nursery:
            serving = partial(
                serve,
                pipeline,
                host=args.host,
                port=args.port,
                graceful_timeout=args.graceful_timeout,
                request_timeout=request_timeout(args.request_timeout, config, DEFAULT_REQUEST_TIMEOUT_S),
                limits=args.limits,
                api_keys=args.api_keys,
                public_metrics=args.public_metrics,
                allowed_origins=args.allowed_origins,
            )
            port = await nursery.start(serving)
            print(f"omnitrio: serving {pipeline.name!r} on http://{args.host}:{port} (Ctrl-C stops)", file=sys.stderr)
    print("omnitrio: stopped", file=sys.stderr)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {text!r}")
    return value


def request_timeout(flag: float | None, config: PipelineConfig, server_default: float) -> float | None:
    """The server's deadline: ``--request-timeout`` (0: none), else the config's ``default_timeout``,
    else ``server_default``."""
    if flag is not None:
        return flag or None
    return server_default if config.default_timeout is None else config.default_timeout


def _log_to_stderr() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("faster_whisper").setLevel(logging.WARNING)  # it logs every clip it decodes


# -- run ---------------------------------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
    from omnitrio.cli_run import run_one

    return run_one(load_config(args.config, args.overrides, device=args.device, dtype=args.dtype, to_start=True), args)


# -- trace -------------------------------------------------------------------------------------


def _trace(argv: Sequence[str]) -> int:
    from omnitrio import trace

    return trace.main(list(argv))
