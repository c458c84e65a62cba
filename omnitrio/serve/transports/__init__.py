"""The transports of a realtime session, side by side.

- :mod:`.websocket`: ``WS /v1/realtime``.
- :mod:`.webrtc`: ``POST /v1/realtime/calls`` and its hang-up (needs aiortc).

Each gives one :class:`~omnitrio.serve.realtime.session.RealtimeSession` a
:class:`~omnitrio.serve.realtime.transport.RealtimeTransport`; neither imports the other, and the
session core imports neither. Importing the package loads none of its modules.
"""
