"""The caller's side of a request: one object whose phase says where the request is, from
submission until its id may be used again."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import trio

from omnitrio import DuplicateRequest, RequestAborted, open_pipeline
from omnitrio.caller import Phase, Submission
from tests.pipelines import chain_config, endless_config

ROOT = Path(__file__).resolve().parents[1]


async def test_a_completed_request_holds_its_id_until_the_caller_lets_go() -> None:
    async with open_pipeline(chain_config(2), inline=True) as pipeline:
        coordinator = pipeline.coordinator
        request = coordinator.open(Submission("r", "x"))
        assert request.phase is Phase.RUNNING
        assert [event.result async for event in request.events] == [{"raw_inputs": "x"}]
        assert request.phase is Phase.COMPLETED
        with pytest.raises(DuplicateRequest):
            coordinator.open(Submission("r", "again"))
        request.leave()
        assert request.phase is Phase.GONE
        assert request.gone.is_set()
        assert await pipeline.submit("r", "again") == {"raw_inputs": "again"}


async def test_an_aborted_request_is_releasing_until_every_stage_let_go() -> None:
    async with open_pipeline(endless_config(), inline=True) as pipeline:
        request = pipeline.coordinator.open(Submission("r", "x"))
        with trio.fail_after(10):
            async for _chunk in request.events:  # the talker streams until aborted
                break
        assert request.fail(RequestAborted("r")) is True
        assert request.phase is Phase.RELEASING
        assert request.fail(RequestAborted("r")) is False  # only a running request fails
        with trio.fail_after(10):
            await request.gone.wait()
        assert request.phase is Phase.GONE
        assert pipeline.coordinator.live_requests == 0


@pytest.mark.parametrize("module", ["omnitrio/caller.py", "omnitrio/coordinator.py", "omnitrio/pipeline.py"])
def test_the_callers_side_uses_no_private_member_of_another_object(module: str) -> None:
    tree = ast.parse((ROOT / module).read_text())
    private = [
        f"{module}:{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    ]
    assert private == []
