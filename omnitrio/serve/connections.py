"""One client connection's failure ends that connection, never the server.

hypercorn's trio worker runs every connection's handler in the server's nursery, so an exception
that escapes one handler ends the whole server. A client can provoke one: send a request whose
body it never finishes, half-close while the answer is being written, and hypercorn's h11
protocol writes its own error answer at the same moment, which raises ``trio.BusyResourceError``
(hypercorn issue #203). :func:`contain_connection_errors` makes hypercorn's trio worker use
:class:`ContainedTCPServer`, whose connections log such an exception and close instead.
"""

from __future__ import annotations

import logging

import hypercorn.trio.run
from hypercorn.trio.tcp_server import TCPServer

log = logging.getLogger("omnitrio.serve")


class ContainedTCPServer(TCPServer):
    """hypercorn's connection handler; an exception ends this connection, logged, not the server."""

    async def run(self) -> None:
        try:
            await super().run()
        except Exception as exc:
            log.warning("a client connection failed and was closed: %r", exc, exc_info=exc)


def contain_connection_errors() -> None:
    """Have hypercorn's trio worker serve each connection with :class:`ContainedTCPServer` (idempotent)."""
    hypercorn.trio.run.TCPServer = ContainedTCPServer  # type: ignore[misc]
