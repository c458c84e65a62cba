"""Stage processes are forks of one fork server that imported their factories' modules once, never
forks of the caller; a server that touched CUDA or runs a thread after its import forks nothing,
and the stage processes start as fresh interpreters, as they do with ``OMNITRIO_START_METHOD=spawn``.
The server leaves with the pipeline."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from omnitrio import PipelineConfig, StageConfig, forkserver, open_pipeline
from omnitrio.cli import load_config
from omnitrio.config_loading import process_factory_paths
from omnitrio.errors import StartupError
from omnitrio.start_method import START_METHOD_ENV, start_fork_server_early
from tests.fork_stages import F
from tests.fork_stages_gated import GATE_ENV


def two_processes(module: str) -> PipelineConfig:
    factory = f"{module}.create_where"
    return PipelineConfig(
        stages=[
            StageConfig(name="a", process="p_a", factory_path=factory, factory={"tag": "a"}, next="b"),
            StageConfig(name="b", process="p_b", factory_path=factory, factory={"tag": "b"}, terminal=True),
        ]
    )


async def where(config: PipelineConfig) -> dict[str, Any]:
    async with open_pipeline(config) as pipeline:
        return await pipeline.submit("r1", "hi")


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_stage_processes_are_forks_of_one_server_that_imported_their_factories() -> None:
    got = await where(two_processes(F))
    a, b = got["a"], got["b"]
    server = a["ppid"]
    assert server != os.getpid() and b["ppid"] == server
    assert a["imported_in"] == b["imported_in"] == server
    assert len({a["pid"], b["pid"], server}) == 3
    assert gone(server)


async def test_with_start_method_spawn_each_stage_process_is_a_fresh_interpreter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(START_METHOD_ENV, "spawn")
    got = await where(two_processes(F))
    for stage in ("a", "b"):
        assert got[stage]["ppid"] == os.getpid()
        assert got[stage]["imported_in"] == got[stage]["pid"]


@pytest.mark.parametrize(
    ("module", "why"), [("tests.fork_stages_cuda", "touched CUDA"), ("tests.fork_stages_thread", "thread")]
)
async def test_a_fork_server_that_must_not_fork_forks_nothing(
    module: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="omnitrio.forkserver")
    got = await where(two_processes(module))
    for stage in ("a", "b"):
        assert got[stage]["ppid"] == os.getpid()
        assert got[stage]["imported_in"] == got[stage]["pid"]
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and why in refusals[0] and module in refusals[0], refusals


def write_two_processes(path: Path, module: str) -> Path:
    factory = f"{module}.create_where"
    stage = '[[stages]]\nname = "{0}"\nprocess = "p_{0}"\nfactory_path = "{1}"\nfactory = {{tag = "{0}"}}\n'
    path.write_text(
        stage.format("a", factory)
        + 'next = "b"\n'
        + stage.format("b", factory)
        + "terminal = true\n"
        + '[[stages]]\nname = "c"\nfactory_path = "no.such.module.create"\n'
    )
    return path


def test_the_factories_a_file_runs_in_processes_are_read_without_importing_them(tmp_path: Path) -> None:
    path = write_two_processes(tmp_path / "p.toml", F)
    assert process_factory_paths(path) == [f"{F}.create_where"] * 2
    assert process_factory_paths(path, ["c.process=p_c"])[-1] == "no.such.module.create"
    assert process_factory_paths(path, ["placement=ray"]) == []
    assert process_factory_paths(tmp_path / "missing.toml") == []


async def test_the_cli_starts_the_fork_server_before_loading_the_config_and_the_pipeline_adopts_it(
    tmp_path: Path,
) -> None:
    path = write_two_processes(tmp_path / "p.toml", F)
    path.write_text(path.read_text().rpartition("[[stages]]")[0])
    config = load_config(path, [], to_start=True)
    assert forkserver._early is not None
    early = forkserver._early.process.pid
    got = await where(config)
    assert got["a"]["ppid"] == got["b"]["ppid"] == got["a"]["imported_in"] == early
    assert forkserver._early is None and gone(early)


async def test_an_early_fork_server_that_does_not_fit_the_pipeline_is_stopped_and_another_started() -> None:
    start_fork_server_early(["omnitrio.child.main"])  # preloads nothing the pipeline's stages need
    assert forkserver._early is not None
    early = forkserver._early.process.pid
    got = await where(two_processes(F))
    assert gone(early)
    assert got["a"]["ppid"] == got["a"]["imported_in"] != early


async def test_a_stage_process_starts_while_the_server_still_imports_another_process_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, built = tmp_path / "gate", tmp_path / "built"
    os.mkfifo(gate)
    os.mkfifo(built)
    monkeypatch.setenv(GATE_ENV, str(gate))  # the server's import of p_b's module waits on the gate
    config = PipelineConfig(
        stages=[
            StageConfig(
                name="a",
                process="p_a",
                factory_path=f"{F}.create_announcing",
                factory={"fifo": str(built), "tag": "a"},
                next="b",
            ),
            StageConfig(
                name="b", process="p_b", factory_path=f"{F}_gated.create_where", factory={"tag": "b"}, terminal=True
            ),
        ]
    )

    async def open_the_gate_once_a_is_built() -> None:
        await trio.to_thread.run_sync(built.read_text, abandon_on_cancel=True)
        await trio.to_thread.run_sync(gate.write_text, "", abandon_on_cancel=True)

    with trio.fail_after(60):  # without the early fork, a is built only after the gate opens: a hang
        async with trio.open_nursery() as nursery:
            nursery.start_soon(open_the_gate_once_a_is_built)
            got = await where(config)
    assert got["a"]["ppid"] == got["b"]["ppid"] == got["b"]["imported_in"]


async def test_a_stage_process_whose_module_the_server_could_not_import_fails_start_up_naming_it() -> None:
    config = two_processes(F)
    config.stages[1].factory_path = f"{F}_broken.create_where"
    with pytest.raises(StartupError) as failed:
        await where(config)
    message = str(failed.value)
    assert "'p_b'" in message and "fork_stages_broken cannot be imported" in message, message
