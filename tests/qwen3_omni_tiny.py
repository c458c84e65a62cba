"""The tiny random Qwen3-Omni checkpoint the Qwen3-Omni tests share, as the fixture ``tiny_qwen3_omni``.

Written once per test process (session scope) by :func:`schedulers.qwen3_omni.tiny.write_checkpoint`;
tests only read it (one that changes a checkpoint copies it first).  A test module imports the fixture
function, :func:`tiny_qwen3_omni_checkpoint`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from schedulers.qwen3_omni.tiny import write_checkpoint


@pytest.fixture(scope="session", name="tiny_qwen3_omni")
def tiny_qwen3_omni_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint's directory (read only); torch runs with one intra-op thread."""
    torch.set_num_threads(1)
    return write_checkpoint(tmp_path_factory.mktemp("qwen3-omni") / "tiny", size="tiny")
