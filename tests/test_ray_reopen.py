"""A user opens and closes Ray-placed pipelines freely in one process: each close leaves nothing
that stops the next open (a local cluster started and stopped per pipeline)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from omnitrio import open_pipeline
from omnitrio.placement.cluster import loopback_env
from tests.test_seed_experiments import BATCH_OUTPUT, FANIN_OUTPUT, STREAM_OUTPUT
from toys.seed import ch4_batch, ch4_fanin, ch4_stream

loopback_env()
ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]


async def test_three_ray_pipelines_open_and_close_one_after_another(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    assert not ray.is_initialized()  # this test starts and stops its own clusters
    for module in (ch4_fanin, ch4_batch, ch4_stream):
        make = module.make_config
        monkeypatch.setattr(module, "make_config", lambda *a, make=make: attrs.evolve(make(*a), placement="ray"))
        await module.main(inline=False)
        assert not ray.is_initialized()
    assert capsys.readouterr().out == FANIN_OUTPUT + BATCH_OUTPUT + STREAM_OUTPUT
    async with open_pipeline(attrs.evolve(ch4_batch.make_config(False), placement="ray")):
        pass
