"""The WebRTC transport of a realtime session (``POST /v1/realtime/calls``; needs aiortc).

- :mod:`.calls`: the route and :class:`~.calls.WebRTCCalls`, which owns every call.
- :mod:`.transport`: one call's peer connection and the :class:`~.transport.WebRTCTransport` it
  gives its :class:`~omnitrio.serve.realtime.session.RealtimeSession`.
- :mod:`.media`: the call's audio tracks; :mod:`.loop`: the asyncio thread aiortc runs on.

Importing the package loads none of its modules (aiortc is imported only when a call is served).
"""
