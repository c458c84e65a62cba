"""The transports of a realtime session, side by side, each with its routes.

- :mod:`.websocket`: ``WS /v1/realtime`` (and the answer to a plain HTTP request there).
- :mod:`.webrtc`: ``POST /v1/realtime/calls`` and its hang-up (needs aiortc).

Each gives one :class:`~omnitrio.serve.realtime.session.RealtimeSession` a
:class:`~omnitrio.serve.realtime.transport.RealtimeTransport`; neither imports the other, and the
session core imports neither. Importing the package loads none of its modules.
"""
