"""Qwen2.5-Omni's front: chat requests in, the thinker's input out.

:mod:`.processor` (the checkpoint's processor without video), :mod:`.preprocess` (chat messages → tensors,
the system prompt, the speaker and knobs), :mod:`.encoders` (the audio and vision towers, batched across
requests) and :mod:`.aggregate` (the thinker's input, whole).
"""
