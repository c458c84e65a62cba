"""A Unix link made before its peer listens delivers what it was given once the peer does, however late.

Stage processes connect to each other as soon as each listens, but a peer may listen long after
(it imports and builds its model first, on a loaded machine): the messages queued for it meanwhile
arrive, in order, and later ones follow.  A link closed while it still waits stops trying.

The clock is trio's autojump clock: the waits are virtual, the sockets real.
"""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from omnitrio.transport.unix import UnixInbound, UnixLink

LATE = 600.0
"""Seconds (virtual) before the peer listens: longer than any start-up of a stage process."""


async def test_a_peer_that_listens_late_gets_every_message_in_order(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = str(tmp_path / "peer.sock")
    link = UnixLink(path, b"sender")
    got: list[bytes] = []
    arrived = trio.Event()

    async def dispatch(sender: str, frames: list[bytes]) -> None:
        assert sender == "sender"
        got.extend(frames)
        if len(got) == 3:
            arrived.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.pump)
        link.send(b"one")
        await trio.sleep(LATE / 2)
        link.send(b"two")
        await trio.sleep(LATE / 2)
        await nursery.start(UnixInbound(path).serve, dispatch)
        link.send(b"three")
        with trio.fail_after(5):
            await arrived.wait()
        nursery.cancel_scope.cancel()
    assert got == [b"one", b"two", b"three"]


async def test_a_link_closed_before_its_peer_listens_stops_trying(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    link = UnixLink(str(tmp_path / "never.sock"), b"sender")
    ended = trio.Event()

    async def pump() -> None:
        await link.pump()
        ended.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump)
        link.send(b"lost")
        await trio.sleep(LATE)
        assert not ended.is_set()  # still waiting for the peer
        link.close()
        with trio.fail_after(5):
            await ended.wait()
    await link.flush()  # the pump dropped its queue: nothing waits to be written
