"""What the start-up tests share: a tiny Qwen3-Omni checkpoint, a short temporary directory, the start-up
events a pipeline wrote."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from omnitrio.events import FILE_PATTERN, PIPELINE_READY, STAGE_WARM, Event


@pytest.fixture(scope="module")
def tiny_qwen3_omni(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Qwen3-Omni checkpoint (skips without torch and transformers)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from schedulers.qwen3_omni.tiny import write_checkpoint

    torch.set_num_threads(1)
    return write_checkpoint(tmp_path_factory.mktemp("qwen3-omni") / "tiny", size="tiny")


def read_events(directory: Path) -> list[Event]:
    """Every event the pipeline's processes wrote into ``directory``."""
    decoder = msgspec.json.Decoder(Event)
    return [decoder.decode(line) for path in directory.glob(FILE_PATTERN) for line in path.read_bytes().splitlines()]


def warmed_before_ready(directory: Path) -> dict[str | None, Any]:
    """Per stage what its ``stage_warm`` event says it warmed; asserts each came before ``pipeline_ready``."""
    found = read_events(directory)
    (ready,) = [e.t_ns for e in found if e.event == PIPELINE_READY]
    warm = [e for e in found if e.event == STAGE_WARM]
    assert all(e.t_ns < ready for e in warm), "a stage said it was warm after the pipeline said ready"
    return {e.stage: e.fields["warmed"] for e in warm}


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """An empty directory with a short path, for a server's ``TMPDIR``: its socket paths must fit a Unix
    socket address (pytest's own temporary paths, under xdist, may not)."""
    path = Path(tempfile.mkdtemp(prefix="ot-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
