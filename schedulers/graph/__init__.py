"""Graph pieces every pipeline family composes: the ingress's task routing and the omni front's routes.

* :mod:`.tasks`: which task a request is (chat, speech, transcription, an ASR session), whether its
  answer is spoken, the ASR stages that serve a realtime session's turn detection and its input
  transcription, and the ingress's admission of a session command;
* :mod:`.front`: the front of an omni model (``preprocess`` → the encoders a request needs →
  ``aggregate``): which encoders a request visits and what ``aggregate`` waits for.

A family's own graph module (``schedulers.speech.pipeline``, ``schedulers.qwen3_omni.graph``) names its
stages and composes these; configs name the family's module.
"""
