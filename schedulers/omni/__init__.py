"""The Qwen3-Omni topology at toy scale: preprocess → encoders → aggregate → thinker → talker → code2wav.

:mod:`.routing` is the per-request graph, :mod:`.stages` the stage factories, :mod:`.inputs` the
chat parsing, :mod:`.encoders` the tiny encoders and :mod:`.responder` the thinker as the
responder of the realtime voice loop.  ``configs/omni-tiny.toml`` wires them.
"""
