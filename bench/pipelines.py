"""The benchmark pipelines, built from whichever runtime's config classes are passed in.

omnitrio's ``PipelineConfig``/``StageConfig``/``FactoryArgs``/``EndpointsConfig`` carry the
peer's names and fields, so one builder serves both: ``classes`` is a module-like object
holding the four classes.  ``process=False`` leaves every stage without a process name
(omnitrio runs it in the caller's trio run); the peer always needs ``process=True``.
"""

from __future__ import annotations

import tempfile
from typing import Any

T = "bench.toy_stages"
S = "bench.toy_stream"
FANIN = "ch4_fanin_stages"  # the seed's module name; each driver puts its own copy on the path
BATCH = "ch4_batch_stages"


def _base(classes: Any, name: str, stages: list[Any]) -> Any:
    return classes.PipelineConfig(
        model_path=name,
        entry_stage=stages[0].name,
        stages=stages,
        endpoints=classes.EndpointsConfig(base_path=tempfile.mkdtemp(prefix="omni-bench-")),
    )


def chain(classes: Any, n: int, *, process: bool, one_process: bool = False) -> Any:
    """``n`` identity stages in a line; one process each, or all in ``p_all`` with ``one_process``."""
    names = [f"s{i}" for i in range(n)]
    stages = [
        classes.StageConfig(
            name=name,
            process=("p_all" if one_process else f"p_{name}") if process else None,
            factory_path=f"{T}.create_echo",
            next=None if i == n - 1 else names[i + 1],
            terminal=i == n - 1,
        )
        for i, name in enumerate(names)
    ]
    return _base(classes, f"chain{n}", stages)


def fan(classes: Any, module: str, *, process: bool) -> Any:
    """The seed's experiment 1: split → {upper, count} with projections → join (wait_for + merge)."""

    def proc(name: str) -> str | None:
        return f"p_{name}" if process else None

    stages = [
        classes.StageConfig(
            name="split",
            process=proc("split"),
            factory_path=f"{module}.create_split",
            next=["upper", "count"],
            project_payload={"upper": f"{module}.project_to_upper", "count": f"{module}.project_to_count"},
        ),
        classes.StageConfig(name="upper", process=proc("upper"), factory_path=f"{module}.create_upper", next="join"),
        classes.StageConfig(name="count", process=proc("count"), factory_path=f"{module}.create_count", next="join"),
        classes.StageConfig(
            name="join",
            process=proc("join"),
            factory_path=f"{module}.create_join",
            wait_for=["upper", "count"],
            merge_fn=f"{module}.merge",
            terminal=True,
        ),
    ]
    return _base(classes, "fan", stages)


def talker_vocoder(classes: Any, *, process: bool, slow: bool = False, steps: int = 100) -> Any:
    """The seed's experiment 3 with ``steps`` chunks; ``slow`` swaps in the abortable 5 ms/step talker."""
    talker_args = classes.FactoryArgs(steps=steps) if not slow else classes.FactoryArgs(steps=200, step_s=0.005)
    stages = [
        classes.StageConfig(
            name="talker",
            process="p_talker" if process else None,
            factory_path=f"{S}.create_slow_talker" if slow else f"{S}.create_talker",
            factory=talker_args,
            next="vocoder",
            stream_to=["vocoder"],
        ),
        classes.StageConfig(
            name="vocoder",
            process="p_vocoder" if process else None,
            factory_path=f"{S}.create_vocoder",
            terminal=True,
            can_accept_stream_before_payload=True,
        ),
    ]
    return _base(classes, "stream", stages)


def tensor_pair(classes: Any, *, process: bool, device: str = "cpu") -> Any:
    """Stage A returns a preallocated tensor on ``device``; stage B (another process) checks it, returns its size."""
    on_device = {"factory": classes.FactoryArgs(device=device)} if device != "cpu" else {}  # the peer: CPU only
    stages = [
        classes.StageConfig(
            name="a",
            process="p_a" if process else None,
            factory_path=f"{T}.create_tensor_source",
            next="b",
            **on_device,
        ),
        classes.StageConfig(
            name="b", process="p_b" if process else None, factory_path=f"{T}.create_tensor_sink", terminal=True
        ),
    ]
    return _base(classes, "tensor", stages)


def batching(classes: Any, module: str, *, process: bool, wait_ms: float, when_idle: bool) -> Any:
    """The seed's experiment 2 encoder (max_batch_size=8) with the given window and idle mode."""
    stage = classes.StageConfig(
        name="encoder",
        process="p_enc" if process else None,
        factory_path=f"{module}.create_encoder",
        factory=classes.FactoryArgs(max_batch_wait_ms=wait_ms, batch_wait_when_idle=when_idle),
        terminal=True,
    )
    return _base(classes, "batch", [stage])
