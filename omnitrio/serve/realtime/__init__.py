"""The realtime session core: one OpenAI Realtime session, whatever transport carries it and whatever
pipeline answers it (a cascade or a speech-native model, as the pipeline's config says).

Nothing here imports a transport (:mod:`omnitrio.serve.transports`), the app or the server;
transports import this package. Importing the package loads none of its modules.

- :mod:`.session`: :class:`~.session.RealtimeSession`, the session itself (reader, writer, turns).
- :mod:`.session_config`: the session's configuration (its defaults, ``session.update``, its readers).
- :mod:`.transport`: what a transport gives the session (:class:`~.transport.RealtimeTransport`).
- :mod:`.protocol`: the wire, both directions: client events parsed, server events spelled GA or beta.
- :mod:`.turn`: what the session does with each VAD event; :mod:`.listen`: server VAD through the
  pipeline's ASR stage; :mod:`.interruption` and :mod:`.backchannel`: speech over an answer;
  :mod:`.idle`: the idle timeout.
- :mod:`.input_buffer`: the input audio buffer; :mod:`.formats`: the audio formats at the edge, and
  :mod:`.g711`: the G.711 codec and resampling streams they use for telephony.
- :mod:`.conversation`: the conversation's items; :mod:`.transcribe`: transcripts of user audio.
- :mod:`.response`: one response from preparation to ``response.done``; :mod:`.response_create`:
  what ``response.create`` may ask; :mod:`.pacing`: audio sent no faster than it plays;
  :mod:`.tools`: function calling; :mod:`.metrics`: Prometheus figures of responses.
- :mod:`.answering`: the one interface through which a response reaches the pipeline that answers
  it, with two implementations: :mod:`.cascade` (the turn's transcript, a chat request, speech
  synthesized from the answer) and :mod:`.speech_native` (the model hears the turn's audio and
  speaks its answer itself).
"""
