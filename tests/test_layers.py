"""The layers hold when the code runs: what imports what, and what a bad factory is told."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from omnitrio import PipelineConfig, StageConfig, open_pipeline
from omnitrio.errors import StartupError
from omnitrio.serve import serve

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "omnitrio"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """Every omnitrio module ``path`` imports when it runs, at the top or inside a function."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        match node:
            case ast.Import(names=names):
                found.update(a.name for a in names if a.name in modules)
            case ast.ImportFrom(module=str(base), level=0) if base in modules:
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def test_the_runtime_has_no_import_circle() -> None:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: imported_modules(path, set(paths)) - {name} for name, path in paths.items()}
    done: set[str] = set()

    def walk(name: str, stack: list[str]) -> None:
        if name in stack:
            cycle = [*stack[stack.index(name) :], name]
            pytest.fail("import circle: " + " -> ".join(cycle))
        if name in done:
            return
        for other in sorted(graph[name]):
            walk(other, [*stack, name])
        done.add(name)

    for name in sorted(graph):
        walk(name, [])


def names_of(path: Path, roots: set[str]) -> set[str]:
    """The top-level packages of ``roots`` that ``path`` imports (anywhere) or names in a dotted
    import path such as a ``factory_path`` string."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        match node:
            case ast.Import(names=names):
                found.update(a.name.split(".")[0] for a in names)
            case ast.ImportFrom(module=str(base), level=0):
                found.add(base.split(".")[0])
            case ast.Constant(value=str(text)) if re.fullmatch(r"[a-z_]+(\.[a-z_0-9]+)+", text):
                found.add(text.split(".")[0])
    return found & roots


def test_bench_and_tests_do_not_import_each_other() -> None:
    """What both use lives in toys/; the tests of the bench tool itself (``test_bench_*.py``) may import it."""
    crossings = []
    for folder, other in (("bench", "tests"), ("tests", "bench")):
        for path in sorted((ROOT / folder).rglob("*.py")):
            hidden = any(part.startswith(".") for part in path.relative_to(ROOT).parts)  # side venvs
            if hidden or path.name.startswith("test_bench_"):
                continue
            if names_of(path, {other}):
                crossings.append(f"{path.relative_to(ROOT)} uses {other}/")
    assert crossings == []


def test_importing_the_contract_loads_no_runtime() -> None:
    probe = (
        "import sys, omnitrio.contract\n"
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('omnitrio', 'trio', 'zmq', 'msgspec'))))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    # the package root's lazy loader (stdlib only) is the one other module it may load
    assert result.stdout.split() == ["omnitrio", "omnitrio.contract", "omnitrio.lazy_names"]


def test_the_package_root_still_offers_the_whole_api() -> None:
    import omnitrio

    for name in omnitrio.__all__:
        assert getattr(omnitrio, name) is not None, name
    with pytest.raises(AttributeError, match="no_such_name"):
        omnitrio.no_such_name  # noqa: B018


def not_a_scheduler(process: str | None) -> PipelineConfig:
    stage = StageConfig(name="odd", process=process, factory_path="toys.stages.create_not_a_scheduler", terminal=True)
    return PipelineConfig(name="odd", stages=[stage])


@pytest.mark.parametrize("process", [None, "p_odd"])
async def test_a_factory_that_returns_no_scheduler_is_named_by_its_stage(process: str | None) -> None:
    with pytest.raises(StartupError) as caught:
        async with open_pipeline(not_a_scheduler(process)):
            pytest.fail("the pipeline started")
    message = str(caught.value)
    assert "stage 'odd'" in message
    assert "toys.stages.create_not_a_scheduler" in message
    assert "inbox" in message


async def test_metrics_show_what_a_stage_process_holds_now() -> None:
    slow = StageConfig(
        name="slow",
        process="p_slow",
        factory_path="toys.stages.create_slow",
        factory={"seconds": 30.0},
        terminal=True,
    )
    async with open_pipeline(PipelineConfig(name="slow", stages=[slow])) as pipeline, trio.open_nursery() as nursery:
        port = await nursery.start(
            lambda task_status: serve(pipeline, port=0, handle_signals=False, task_status=task_status)
        )
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for held in (1, 2):
                nursery.start_soon(pipeline.submit, f"r{held}", "x")
                with trio.fail_after(30):  # each health() waits for the stage process's answer
                    while (await pipeline.health())["stages"]["slow"]["active_requests"] < held:
                        pass
                text = (await client.get("/metrics")).text
                assert f'omnitrio_stage_active_requests{{stage="slow"}} {held:.1f}' in text
        nursery.cancel_scope.cancel()


def all_imports(path: Path) -> set[str]:
    """Every module ``path`` names in an import, type-only ones included (``from a import b``: ``a`` and ``a.b``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        match node:
            case ast.Import(names=names):
                found.update(a.name for a in names)
            case ast.ImportFrom(module=str(base), level=0):
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)
    return found


def test_schedulers_import_only_the_contract_from_omnitrio_and_never_trio() -> None:
    crossings = []
    for path in sorted((ROOT / "schedulers").rglob("*.py")):
        for name in sorted(all_imports(path)):
            top = name.split(".")[0]
            if top == "trio" or (top == "omnitrio" and name not in ("omnitrio", "omnitrio.contract")):
                if not name.startswith("omnitrio.contract."):
                    crossings.append(f"{path.relative_to(ROOT)} imports {name}")
    assert crossings == []


def test_the_runtime_has_no_import_circle_even_through_type_only_imports() -> None:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: (all_imports(path) & set(paths)) - {name} for name, path in paths.items()}
    circles = [
        f"{name} <-> {other}"
        for name, targets in graph.items()
        for other in targets
        if name < other and name in graph[other]
    ]
    assert circles == []


def test_importing_the_realtime_session_core_loads_no_server() -> None:
    probe = (
        "import sys, omnitrio.serve.realtime.session_config\n"
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('hypercorn', 'starlette')"
        " or m in ('omnitrio.serve.app', 'omnitrio.serve.server'))))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.split() == []


SERVE_LAYERS = (
    # (layer, its modules by prefix); a module imports serve modules of its own part or of a lower layer only
    (0, ("context", "output", "openai_types", "api_errors", "api_metrics", "limits", "admission", "auth")),
    (0, ("model_names",)),
    (0, ("origins", "connections", "audio")),
    (1, ("realtime",)),
    (2, ("transports.websocket",)),
    (2, ("transports.webrtc",)),
    (2, ("routes",)),
    (2, ("page",)),
    (3, ("app", "server")),
)


SERVE_PACKAGES = ("omnitrio.serve", "omnitrio.serve.transports")  # packages that hold parts, not a part


def serve_part(module: str) -> tuple[int, int] | None:
    """The layer of an ``omnitrio.serve`` module and which part of it, or None for a package of parts."""
    name = module.removeprefix("omnitrio.serve.")
    for index, (layer, prefixes) in enumerate(SERVE_LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return layer, index
    return None


def test_serve_imports_go_from_transports_and_routes_to_the_realtime_core_to_shared_helpers() -> None:
    paths = {module_name(p): p for p in (PACKAGE / "serve").rglob("*.py")}
    for name in paths:
        assert name in SERVE_PACKAGES or serve_part(name) is not None, f"{name} has no layer in SERVE_LAYERS"
    upward = []
    for name, path in sorted(paths.items()):
        here = serve_part(name)
        for other in sorted(all_imports(path) & set(paths)):
            there = serve_part(other)
            if here is None or there is None or other == name:
                continue
            if there[0] > here[0] or (there[0] == here[0] and there[1] != here[1] and here[0] > 0):
                upward.append(f"{name} imports {other}")
    assert upward == []


def test_the_realtime_core_reaches_the_answering_pipeline_only_through_its_answering_interface() -> None:
    """Only the answering base (each ``Answering`` builds its inputs), server VAD and input transcription
    call the pipeline."""
    allowed = {"answering.py", "listen.py", "transcribe.py"}
    calls = re.compile(r"\.pipeline\.(stream|abort|submit)\(")
    crossings = [
        path.name for path in sorted((PACKAGE / "serve" / "realtime").glob("*.py")) if calls.search(path.read_text())
    ]
    assert set(crossings) <= allowed, crossings


QWEN3_OMNI = ROOT / "schedulers" / "qwen3_omni"
QWEN3_OMNI_PARTS = ("front", "thinker", "talker", "code2wav")
RETIRED_TOYS = ("toys", "schedulers.omni", "schedulers.ar.talker", "schedulers.ar.vocoder")


def family_part(module: str, family: str, parts: tuple[str, ...]) -> str | None:
    """Which part folder of a model family ``module`` lies in, or None for the family level and elsewhere."""
    rest = module.removeprefix(family + ".").split(".")[0] if module.startswith(family + ".") else None
    return rest if rest in parts else None


def test_no_part_of_qwen3_omni_imports_another_part() -> None:
    """front, thinker, talker and code2wav share only what lives at the family level (checkpoint, graph)."""
    family = "schedulers.qwen3_omni"
    crossings = []
    for path in sorted(QWEN3_OMNI.rglob("*.py")):
        here = family_part(module_name(path), family, QWEN3_OMNI_PARTS)
        for name in sorted(all_imports(path)):
            there = family_part(name, family, QWEN3_OMNI_PARTS)
            if here is not None and there is not None and there != here:
                crossings.append(f"{path.relative_to(ROOT)} imports {name}")
    assert crossings == []


def test_qwen3_omni_imports_no_toy() -> None:
    crossings = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted(QWEN3_OMNI.rglob("*.py"))
        for name in sorted(all_imports(path))
        if any(name == toy or name.startswith(toy + ".") for toy in RETIRED_TOYS)
    ]
    assert crossings == []
