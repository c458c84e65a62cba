"""The OpenAI HTTP routes and what only they use.

- :mod:`.chat`: ``POST /v1/chat/completions``.
- :mod:`.speech`: ``POST /v1/audio/speech``; :mod:`.audio_files`: its compressed formats.
- :mod:`.transcription`: ``POST /v1/audio/transcriptions``.
- :mod:`.models`: ``GET /v1/models`` and the cards it lists.
- :mod:`.client_secrets`: ``POST /v1/realtime/client_secrets``, keys a browser page may hold.
- :mod:`.sse`: streamed responses and SSE framing.

Routes import the shared helpers of :mod:`omnitrio.serve` (errors, context, model names, audio,
output) and, for client secrets, the realtime session configuration; nothing outside the app imports a route.
"""
