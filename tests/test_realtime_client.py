"""``omnitrio.client.RealtimeClient.receive_until``: a step's events, in order, and nothing lost or skipped."""

from __future__ import annotations

import pytest
import trio

from omnitrio.client import open_realtime
from tests.fake_pipeline import Served, start_server


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    return await start_server(nursery)


async def test_receive_until_returns_every_event_up_to_the_awaited_one_and_leaves_the_rest(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        created = await rt.receive_until("session.created")
        await rt.send({"type": "session.update", "session": {"turn_detection": None}})
        await rt.send({"type": "input_audio_buffer.clear"})
        updated = await rt.receive_until("session.updated", "input_audio_buffer.cleared")
        cleared = await rt.receive_until("input_audio_buffer.cleared")
    assert [e["type"] for e in created] == ["session.created"]  # the first event the server sends
    assert [e["type"] for e in updated][-1] == "session.updated"  # the first of the two, in the server's order
    assert "input_audio_buffer.cleared" not in [e["type"] for e in updated[:-1]]
    assert "session.updated" not in [e["type"] for e in cleared]  # the next call starts after it


async def test_receive_until_says_what_it_waited_for_when_it_does_not_come(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        await rt.receive_until("session.created")
        await rt.send({"type": "session.update", "session": {"turn_detection": None}})
        await rt.receive_until("session.updated")
        with pytest.raises(trio.TooSlowError, match=r"no response\.done or error within 0\.2 s; received \[\]"):
            await rt.receive_until("response.done", "error", timeout=0.2)


async def test_receive_until_needs_an_event_type(served: Served) -> None:
    async with open_realtime(served.ws_url) as rt:
        with pytest.raises(ValueError, match="at least one event type"):
            await rt.receive_until()
