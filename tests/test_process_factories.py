"""A stage in a process of its own has its factory imported and checked there, not by ``serve``:
the serving process does not import what only that stage needs (torch, say), and a factory argument
the factory does not accept still fails start-up naming the stage and the argument, as ``check``
(which imports every factory up front) reports it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from omnitrio.cli import main

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = """
name = "toy"
[[stages]]
name = "words"
factory_path = "toys.stages.create_words"
next = "tag"
[[stages]]
name = "tag"
process = "p"
factory_path = "tests.torch_stages.create_torch_tag"
terminal = true
"""
BAD_ARGUMENT = (
    "omnitrio: error: stages[1] ('tag'): factory: tests.torch_stages.create_torch_tag does not accept ['tagx']"
)
REPORT_TORCH = (
    "import atexit, sys; "
    "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules, file=sys.stderr)); "
    "from omnitrio.cli import main; sys.exit(main(sys.argv[1:]))"
)
"""``python -m omnitrio`` that says, as it exits, whether it imported torch."""


@pytest.fixture
def pipeline(tmp_path: Path) -> Path:
    path = tmp_path / "pipeline.toml"
    path.write_text(PIPELINE)
    return path


def serve(pipeline: Path, *args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-c", REPORT_TORCH, "serve", "--config", str(pipeline), "--port", "0", *args]
    return subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)


def test_serving_leaves_torch_to_the_stage_process_that_needs_it(pipeline: Path) -> None:
    server = serve(pipeline)
    assert server.stderr is not None
    seen = []
    try:
        for line in server.stderr:
            seen.append(line)
            if line.startswith("omnitrio: serving"):
                server.send_signal(signal.SIGINT)
        assert server.wait(60) == 0, "".join(seen)
    finally:
        server.kill()
        server.wait()
    assert "torch imported: False\n" in seen, "".join(seen)


def test_serve_fails_start_up_naming_a_process_stage_and_its_bad_factory_argument(pipeline: Path) -> None:
    server = serve(pipeline, "--set", "tag.factory.tagx=1")
    try:
        _, err = server.communicate(timeout=120)
    finally:
        server.kill()
        server.wait()
    assert server.returncode == 2, err
    assert BAD_ARGUMENT in err


def test_check_reports_the_bad_factory_argument_of_a_process_stage(
    pipeline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(pipeline), "--set", "tag.factory.tagx=1"]) == 2
    assert BAD_ARGUMENT in capsys.readouterr().err


@pytest.mark.parametrize("config", ["qwen3-omni.toml", "qwen2.5-omni.toml"])
def test_a_qwen_omni_caller_routes_without_importing_torch(config: str) -> None:
    """Its inline stage and its routing functions read the handoff classes, whose tensors are only annotations."""
    code = (
        "import sys; from omnitrio.config_loading import load; from omnitrio.topology import Topology; "
        "Topology.compile(load(sys.argv[1], process_factories=False)); print('torch' in sys.modules)"
    )
    found = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "configs" / config)], cwd=ROOT, capture_output=True, text=True
    )
    assert found.stdout == "False\n", found.stderr
