"""OpenAI-compatible HTTP/SSE and realtime (WebSocket, WebRTC) serving of one pipeline (hypercorn, trio worker).

The server uses only the pipeline API a Python user has: ``name``, ``stream``, ``abort``,
``health``, ``refresh_stage_gauges`` and ``metrics_registry``. Every request, streamed or not, is served through
``async with pipeline.stream(request_id, inputs, timeout=...) as messages``; leaving that block
(the client went away, ``response.cancel``, the socket closed, shutdown) aborts the request at
every stage. The request id is the response id the client sees (``chatcmpl-…``, ``resp-…``).

What the server hands a pipeline (``inputs``), by route:

- chat: ``{"task": "chat", "messages": [OpenAI messages], "modalities": ["text"] | ["text", "audio"],
  "audio": {"voice": str, "format": str} | None, "max_tokens": int | None, "temperature": float | None}``;
  the messages as the client sent them, ``input_audio`` parts included (checked to decode first)
- speech: ``{"task": "speech", "input": str, "voice": str, "speed": float}``
- transcription: ``{"task": "transcription", "audio": float32 mono numpy array at 16 kHz,
  "language": str | None, "prompt": str | None}``
- realtime, which sends no input of its own, answers each response with a chat request, in one of
  two ways the pipeline's config names (``PipelineConfig.realtime_answer``; :mod:`.realtime.answering`):
  a cascade (``"cascade"``, the default) first transcribes each committed turn with
  ``{"task": "transcription", "audio": ..., "quick": True}`` and sends the transcripts as text
  messages, with ``"session_id"`` (the session's, or None for an out-of-band response),
  ``"max_tokens"``, ``"modalities"``, ``"speed"`` and the session's tools added; a speech-native
  pipeline (``"speech-native"``) gets the turns' audio itself as ``input_audio`` parts, with
  ``"max_tokens"``, ``"modalities"`` and ``"audio": {"voice", "format"}``, and speaks its answer.
  Either way server VAD drives an ASR session stage with
  ``{"task": "asr_session", "command": {"op": "open" | "append" | "abort", "session_id", ...}}``

What a pipeline streams back (``StreamMessage.modality`` and ``chunk``):

- ``"text"`` (or ``None``): a ``str`` delta of the answer text (of the transcript, for transcription).
- ``"audio"``: ``{"pcm": mono int16 array or float array in [-1, 1], "sample_rate": int}``.
- ``"transcript"``: a ``str`` delta of what the output audio says.

and finally ``CompleteMessage.result``: a dict that may carry ``"text"``, ``"transcript"``,
``"audio"`` (same shape as an audio chunk) and ``"usage"`` (OpenAI usage fields), or a bare ``str``
meaning ``{"text": ...}``. Fields the pipeline did not stream are taken from the result, so a
pipeline that does not stream is served too. With several terminal stages, the first result to
name a field wins.

Only the routes whose task the pipeline serves are offered (``PipelineConfig.serves``; all when
unset). Voices come from the pipeline, and the pipeline gets a ``voice`` as sent: a pipeline whose
stages know their voices (``PipelineConfig.stage_voices``, e.g. a checkpoint's speakers) takes any
name in chat and realtime, answering one it lacks with a 400; any other has one voice, which
``"default"`` and every OpenAI voice name select (other names are a 400).

Audio at the API edge is PCM16 mono: chat and realtime at 24 kHz, speech ``pcm`` at 24 kHz, speech
``wav`` at the pipeline's rate. Admission errors raised when entering ``pipeline.stream``
(``Overloaded``…) become HTTP statuses even for streaming requests; see :mod:`.api_errors`.

Where things are (imports go down this list, never up; ``tests/test_layers.py`` checks it):

- :mod:`.server` (hypercorn, the listening socket) and :mod:`.app` (the Starlette app: every route,
  the lifespan, health and metrics).
- :mod:`.transports`, the two transports of a realtime session, each with its routes:
  :mod:`.transports.websocket` (``WS /v1/realtime``) and :mod:`.transports.webrtc`
  (``POST /v1/realtime/calls``); :mod:`.routes`, the OpenAI HTTP routes (chat, speech,
  transcription, models, client secrets) and SSE; :mod:`.page`, the voice page (``GET /``, ``static/``).
- :mod:`.realtime`: the realtime session core, socket-free (session, its configuration, turns,
  responses, conversation, the wire protocol, audio formats, pacing, tools, and how a cascade or a
  speech-native pipeline answers).
- What all of them share: :mod:`.context` (the served pipeline, ids, body reads, error answers),
  :mod:`.output` (a pipeline's stream folded into fields), :mod:`.openai_types` (request checks,
  voices), :mod:`.model_names` (the model names each route answers to), :mod:`.api_errors`,
  :mod:`.api_metrics`, :mod:`.limits`, :mod:`.admission`, :mod:`.auth`, :mod:`.origins`,
  :mod:`.connections`, and :mod:`.audio` (PCM, WAV, resampling).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omnitrio.lazy_names import lazy_names

if TYPE_CHECKING:
    from omnitrio.serve.app import create_app
    from omnitrio.serve.server import BindError, bind_socket, serve

_HOMES = {
    "BindError": "omnitrio.serve.server",
    "bind_socket": "omnitrio.serve.server",
    "create_app": "omnitrio.serve.app",
    "serve": "omnitrio.serve.server",
}
"""Where each public name lives: loaded on first use, so importing a submodule (the socket-free
``realtime.session_config``) loads neither the app nor hypercorn."""

__all__ = ["BindError", "bind_socket", "create_app", "serve"]


__getattr__, __dir__ = lazy_names(__name__, _HOMES)
