"""Pipeline configuration: the objects and their full validation.

Names follow SGLang-Omni (``PipelineConfig``, ``StageConfig``, ``FactoryArgs``,
``EndpointsConfig``) so a pipeline written for it ports by changing imports.

:func:`validate` runs before anything starts and raises one :class:`ConfigError` that
names the stage and field, e.g. ``stages[3] ('join'): wait_for needs merge_fn``.  It
imports every function the config names and checks factory arguments against the
factory's signature, so a typo never surfaces as a child process that fails to start.
Building a config from plain data or a TOML file, and ``--set`` overrides, are
:mod:`omnitrio.config_loading`'s.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import attrs

from omnitrio.errors import ConfigError
from omnitrio.importing import ImportPathError, import_object
from omnitrio.replicas import REPLICAS_KEY

DEFAULT_MODEL_ARGS = ("responder.factory.model_path",)  # what `--model FILE.gguf` sets unless a config says

SERVED_TASKS = ("chat", "speech", "transcription", "realtime")
REALTIME_ANSWERS = ("cascade", "speech-native")


class FactoryArgs:
    """Keyword arguments for a stage factory, spelled ``FactoryArgs(max_batch_wait_ms=200)``.

    Any name is accepted here; :func:`validate` checks each against the factory's
    signature.  ``None`` values mean "use the factory's default" and are not passed.
    """

    def __init__(self, **kwargs: Any) -> None:
        self.values: dict[str, Any] = dict(kwargs)

    def to_kwargs(self) -> dict[str, Any]:
        return {k: v for k, v in self.values.items() if v is not None}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FactoryArgs) and other.values == self.values

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.values.items())
        return f"FactoryArgs({inner})"


def _factory_args(value: FactoryArgs | Mapping[str, Any] | None) -> FactoryArgs:
    if value is None:
        return FactoryArgs()
    if isinstance(value, FactoryArgs):
        return value
    if isinstance(value, Mapping):
        return FactoryArgs(**value)
    raise TypeError(f"factory must be FactoryArgs or a dict, got {type(value).__name__}")


def _str_list(value: str | Iterable[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


@attrs.define
class StageConfig:
    """One stage: where it runs, what builds its scheduler, where its outputs go."""

    name: str
    factory_path: str
    process: str | None = None
    factory: FactoryArgs = attrs.field(factory=FactoryArgs, converter=_factory_args)
    next: str | list[str] | None = None
    terminal: bool = False
    route_fn: str | None = None
    project_payload: dict[str, str] = attrs.field(factory=dict)
    wait_for: list[str] = attrs.field(factory=list, converter=_str_list)
    merge_fn: str | None = None
    wait_for_fn: str | None = None
    stream_to: list[str] = attrs.field(factory=list, converter=_str_list)
    stream_done_to_fn: str | None = None
    can_accept_stream_before_payload: bool = False
    max_queue: int | None = None
    """Most requests this stage holds at once; past it a new one fails with ``Overloaded``."""
    scheduler_restarts: int = 5
    """Most times a crashed scheduler is rebuilt over the stage's life; past it the stage is
    dead (its requests fail naming it; the rest of the pipeline serves)."""
    scheduler_restart_backoff: float = 0.05
    """Seconds before rebuilding a crashed scheduler; doubled after each rebuild in a row
    that crashed before delivering an output (see :mod:`omnitrio.supervision`)."""
    scheduler_stop_timeout: float = 3.0
    """Seconds the scheduler's ``start()`` has to return after ``stop()`` when the pipeline
    shuts down; past it shutdown goes on without it, with a warning naming the stage (see
    :mod:`omnitrio.bridge`)."""
    warm_up_timeout: float = 600.0
    """Seconds the scheduler's warm-up (``warm_up_serving_thread()``, before the stage reports
    ready) may take; past it the stage fails to start, naming it (see :mod:`omnitrio.supervision`)."""

    @property
    def next_stages(self) -> list[str]:
        return _str_list(self.next)


@attrs.define
class EndpointsConfig:
    """Where the pipeline's sockets live; ``None`` means a fresh temp dir per pipeline."""

    base_path: str | None = None


@attrs.define
class PipelineConfig:
    """A whole pipeline.

    ``restart`` says what happens when a stage process dies: ``"on-failure"`` restarts it
    (at most ``max_restarts`` times), ``"never"`` leaves its stages dead.  ``max_in_flight``
    bounds live requests (past it ``submit`` raises ``Overloaded`` at once);
    ``default_timeout`` is the deadline of requests that give none.
    """

    stages: list[StageConfig]
    name: str | None = None
    model_path: str | None = None
    entry_stage: str | None = None
    endpoints: EndpointsConfig = attrs.field(factory=EndpointsConfig)
    restart: Literal["on-failure", "never"] = "on-failure"
    max_restarts: int = 3
    max_in_flight: int | None = None
    default_timeout: float | None = None
    startup_timeout: float = 60.0
    terminal_stages_fn: str | None = None
    transport: Literal["unix", "zmq"] = "unix"
    """Between processes of one host: Unix stream sockets (fastest) or pyzmq ``ipc://``."""
    scheduler_nice: int = 0
    """How much lower than its IO loop a stage process runs its scheduler thread (Linux
    niceness, 0-19; 0, the default, leaves it alone).  When the cores are oversubscribed
    the IO loop, which carries every request's messages, then runs first, so one request's
    burst of light compute does not hold back another's first output; compute pays for it
    (bench/results has the trade measured)."""
    placement: Literal["local", "ray"] = "local"
    """Where process groups run: child processes of the caller, or Ray actors (TCP between them)."""
    ray_address: str | None = None
    """With ``placement = "ray"``: the cluster to join; None starts a loopback-only local one."""
    processes: dict[str, dict[str, float]] = attrs.field(factory=dict)
    """Per process group: ``replicas`` (how many copies run, default 1; see
    :mod:`omnitrio.replicas`) and the Ray resources each copy asks for, e.g.
    ``{"thinker": {"num_gpus": 1, "num_cpus": 2}, "encoder": {"replicas": 2}}``; any other
    key is a custom resource.  A group asks for nothing it does not name (0 CPUs)."""
    model_args: list[str] = attrs.field(factory=lambda: list(DEFAULT_MODEL_ARGS))
    """The fields ``--model PATH`` sets (``stage.factory.field``, each to the absolute path): the
    responder's GGUF file by default; a pipeline whose stages all read one checkpoint lists each."""
    name_from_model: bool = False
    """With ``--model PATH`` (:func:`~omnitrio.config_loading.load`'s ``model``): the pipeline is named
    PATH's basename (a checkpoint directory's name is the model id clients see in ``/v1/models``)
    instead of ``name``."""
    stage_voices: bool = False
    """The pipeline's stages choose the voice themselves (e.g. a checkpoint's speakers): the server
    passes a chat request's ``audio.voice`` through unchecked and a stage answers a voice it does not
    have (``InvalidRequest``, a 400).  False: the server accepts only OpenAI's voice names."""
    serves: list[str] | None = None
    """The tasks the server offers for this pipeline: any of ``"chat"``, ``"speech"``,
    ``"transcription"``, ``"realtime"`` (see ``omnitrio.serve``); the other routes answer 404
    naming these.  ``None`` offers every route."""
    realtime_answer: str = "cascade"
    """How a realtime session's turn is answered (one of :data:`REALTIME_ANSWERS`): ``"cascade"``
    transcribes the turn and answers its transcript with the ``chat`` task (ASR → LLM → TTS);
    ``"speech-native"`` hands the turn's audio to a model that hears it and speaks its answer
    (``omnitrio.serve.realtime.speech_native``). Input transcription needs ``"transcription"`` in
    ``serves`` either way; a speech-native pipeline answers without it."""

    def __attrs_post_init__(self) -> None:
        if self.name is None:
            self.name = self.model_path or "omnitrio"
        if self.entry_stage is None and self.stages:
            self.entry_stage = self.stages[0].name

    @property
    def terminal_stages(self) -> list[StageConfig]:
        return [s for s in self.stages if s.terminal]

    def resources(self, group: str) -> dict[str, float]:
        """The Ray resources one copy of process group ``group`` asks for."""
        return {k: v for k, v in self.processes.get(group, {}).items() if k != REPLICAS_KEY}

    def stage(self, name: str) -> StageConfig:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)


def validate(config: PipelineConfig, *, process_factories: bool = True) -> None:
    """Check every rule of SPEC §2; raise one :class:`ConfigError` naming stage and field.

    ``process_factories=False`` leaves out the factory check (import, arguments) of the stages that
    name a ``process``: a caller that starts the pipeline leaves it to that stage's own process,
    which runs :func:`check_factory` before it reports ready (:mod:`omnitrio.factory`)."""
    if not isinstance(config, PipelineConfig):
        raise ConfigError(f"expected a PipelineConfig, got {type(config).__name__}")
    if not config.stages:
        raise ConfigError("stages: a pipeline needs at least one stage")
    names: dict[str, int] = {}
    for i, stage in enumerate(config.stages):
        if not isinstance(stage, StageConfig):
            raise ConfigError(f"stages[{i}]: expected a StageConfig, got {type(stage).__name__}")
        if not isinstance(stage.name, str) or not stage.name.strip() or stage.name.startswith("@"):
            raise ConfigError(f"stages[{i}]: name must be a non-empty string not starting with '@', got {stage.name!r}")
        if stage.name in names:
            raise ConfigError(f"stages[{i}] ({stage.name!r}): name: duplicate of stages[{names[stage.name]}]")
        names[stage.name] = i
    if config.entry_stage not in names:
        raise ConfigError(f"entry_stage: unknown stage {config.entry_stage!r}; stages are {sorted(names)}")
    if config.restart not in ("on-failure", "never"):
        raise ConfigError(f"restart: must be 'on-failure' or 'never', got {config.restart!r}")
    if config.transport not in ("unix", "zmq"):
        raise ConfigError(f"transport: must be 'unix' or 'zmq', got {config.transport!r}")
    if config.placement not in ("local", "ray"):
        raise ConfigError(f"placement: must be 'local' or 'ray', got {config.placement!r}")
    _check_processes(config)
    if config.max_restarts < 0:
        raise ConfigError(f"max_restarts: must be >= 0, got {config.max_restarts}")
    if type(config.scheduler_nice) is not int or not 0 <= config.scheduler_nice <= 19:
        raise ConfigError(f"scheduler_nice: must be an integer from 0 to 19, got {config.scheduler_nice!r}")
    if config.max_in_flight is not None and config.max_in_flight < 1:
        raise ConfigError(f"max_in_flight: must be >= 1, got {config.max_in_flight}")
    if config.default_timeout is not None and config.default_timeout <= 0:
        raise ConfigError(f"default_timeout: must be > 0, got {config.default_timeout}")
    if config.serves is not None and not set(config.serves) <= set(SERVED_TASKS):
        raise ConfigError(f"serves: must name tasks from {list(SERVED_TASKS)}, got {config.serves!r}")
    if config.realtime_answer not in REALTIME_ANSWERS:
        raise ConfigError(f"realtime_answer: must be one of {list(REALTIME_ANSWERS)}, got {config.realtime_answer!r}")
    if not config.terminal_stages:
        raise ConfigError("stages: no stage is terminal; set terminal=true on the stage whose result is returned")
    if config.terminal_stages_fn is not None:
        _check_callable(config.terminal_stages_fn, "pipeline: terminal_stages_fn")

    for i, stage in enumerate(config.stages):
        _validate_stage(i, stage, config, names)
        if process_factories or not stage.process:
            check_factory(config, stage.name)
    _check_reachable(config)
    _check_acyclic(config)
    _check_senders(config)


def _check_processes(config: PipelineConfig) -> None:
    groups = {s.process for s in config.stages if s.process}
    for name, resources in config.processes.items():
        if name not in groups:
            raise ConfigError(f"processes.{name}: no stage has process = {name!r}; groups are {sorted(groups)}")
        for key, amount in resources.items():
            if isinstance(amount, bool) or not isinstance(amount, int | float) or amount < 0:
                raise ConfigError(f"processes.{name}.{key}: must be a number >= 0, got {amount!r}")
        replicas = resources.get(REPLICAS_KEY, 1)
        if replicas < 1 or replicas != int(replicas):
            raise ConfigError(f"processes.{name}.replicas: must be a whole number >= 1, got {replicas!r}")
        taken = [g for g in groups if g.startswith(f"{name}.") and g.removeprefix(f"{name}.").isdigit()]
        if replicas > 1 and taken:
            raise ConfigError(
                f"processes.{name}.replicas: its copies are named {name}.0, {name}.1 …; rename group {taken[0]!r}"
            )


def _validate_stage(i: int, stage: StageConfig, config: PipelineConfig, names: Mapping[str, int]) -> None:
    label = f"stages[{i}] ({stage.name!r})"

    def fail(field: str, message: str) -> ConfigError:
        return ConfigError(f"{label}: {field}: {message}")

    def known(field: str, targets: Iterable[str]) -> None:
        for t in targets:
            if t not in names:
                raise fail(field, f"unknown stage {t!r}")
            if t == stage.name:
                raise fail(field, "a stage cannot name itself")

    if stage.process is not None and (not isinstance(stage.process, str) or not stage.process.strip()):
        raise fail("process", f"must be a non-empty string or omitted, got {stage.process!r}")
    nexts = stage.next_stages
    if stage.terminal and nexts:
        raise fail("next", "a stage sets exactly one of next / terminal, not both")
    if not stage.terminal and not nexts:
        raise fail("next", "a stage sets exactly one of next / terminal; this one sets neither")
    if len(set(nexts)) != len(nexts):
        raise fail("next", f"lists a stage twice: {nexts}")
    known("next", nexts)
    if stage.route_fn is not None:
        if stage.terminal:
            raise fail("route_fn", "a terminal stage has nowhere to route")
        _check_callable(stage.route_fn, f"{label}: route_fn")
    for target, fn in stage.project_payload.items():
        if target not in nexts:
            raise fail("project_payload", f"{target!r} is not in next {nexts}")
        _check_callable(fn, f"{label}: project_payload[{target!r}]")
    if stage.wait_for and stage.merge_fn is None:
        raise fail("wait_for", "wait_for needs merge_fn")
    if stage.merge_fn is not None and not stage.wait_for:
        raise fail("merge_fn", "merge_fn needs wait_for (the sources to merge)")
    if stage.wait_for_fn is not None and not stage.wait_for:
        raise fail("wait_for_fn", "wait_for_fn needs wait_for")
    known("wait_for", stage.wait_for)
    for source in stage.wait_for:
        upstream = config.stage(source)
        if stage.name not in upstream.next_stages:
            raise fail("wait_for", f"{source!r} never sends here (its next is {upstream.next_stages})")
    if stage.merge_fn is not None:
        _check_callable(stage.merge_fn, f"{label}: merge_fn")
    if stage.wait_for_fn is not None:
        _check_callable(stage.wait_for_fn, f"{label}: wait_for_fn")
    known("stream_to", stage.stream_to)
    if stage.stream_done_to_fn is not None:
        if not stage.stream_to:
            raise fail("stream_done_to_fn", "stream_done_to_fn needs stream_to")
        _check_callable(stage.stream_done_to_fn, f"{label}: stream_done_to_fn")
    if stage.max_queue is not None and stage.max_queue < 1:
        raise fail("max_queue", f"must be >= 1, got {stage.max_queue}")
    if type(stage.scheduler_restarts) is not int or stage.scheduler_restarts < 0:
        raise fail("scheduler_restarts", f"must be an integer >= 0, got {stage.scheduler_restarts!r}")
    backoff = stage.scheduler_restart_backoff
    if isinstance(backoff, bool) or not isinstance(backoff, int | float) or not 0 <= backoff < math.inf:
        raise fail("scheduler_restart_backoff", f"must be a number of seconds >= 0, got {backoff!r}")
    for field in ("scheduler_stop_timeout", "warm_up_timeout"):
        seconds = getattr(stage, field)
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds < math.inf:
            raise fail(field, f"must be a number of seconds > 0, got {seconds!r}")


def _check_senders(config: PipelineConfig) -> None:
    for i, stage in enumerate(config.stages):
        senders = [s.name for s in config.stages if stage.name in s.next_stages]
        # Several stages send here: without wait_for each would start its own request.
        if len(senders) > 1 and not stage.wait_for and not all(config.stage(s).route_fn for s in senders):
            raise ConfigError(
                f"stages[{i}] ({stage.name!r}): wait_for: several stages send here ({senders}); set wait_for + merge_fn"
            )


def _check_callable(path: str, where: str) -> Callable[..., Any]:
    try:
        obj = import_object(path)
    except ImportPathError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not callable(obj):
        raise ConfigError(f"{where}: {path!r} is not callable")
    return obj  # type: ignore[no-any-return]


def check_factory(config: PipelineConfig, name: str) -> Callable[..., Any]:
    """Import stage ``name``'s factory and check its arguments against its signature; return it.

    Raises a :class:`ConfigError` naming the stage and the argument (the one :func:`validate` raises).
    """
    i, stage = next((i, s) for i, s in enumerate(config.stages) if s.name == name)
    label = f"stages[{i}] ({stage.name!r})"
    factory = _check_callable(stage.factory_path, f"{label}: factory_path")
    kwargs = stage.factory.to_kwargs()
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return factory
    params = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return factory
    accepted = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise ConfigError(
            f"{label}: factory: {stage.factory_path} does not accept {unknown}; it accepts {sorted(accepted)}"
        )
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{label}: factory: {stage.factory_path}: {exc}") from None
    return factory


def _check_reachable(config: PipelineConfig) -> None:
    seen = {config.entry_stage}
    frontier = [config.entry_stage]
    while frontier:
        stage = config.stage(frontier.pop())  # type: ignore[arg-type]
        for t in [*stage.next_stages, *stage.stream_to]:
            if t not in seen:
                seen.add(t)
                frontier.append(t)
    for i, stage in enumerate(config.stages):
        if stage.name not in seen:
            raise ConfigError(
                f"stages[{i}] ({stage.name!r}): unreachable: no path from entry stage {config.entry_stage!r}"
            )


def _check_acyclic(config: PipelineConfig) -> None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for t in config.stage(name).next_stages:
            if state.get(t) == 1:
                cycle = " -> ".join([*path[path.index(t) :], t])
                i = [s.name for s in config.stages].index(name)
                raise ConfigError(f"stages[{i}] ({name!r}): next: cycle {cycle}")
            if t not in state:
                visit(t, [*path, t])
        state[name] = 2

    for stage in config.stages:
        if stage.name not in state:
            visit(stage.name, [stage.name])
