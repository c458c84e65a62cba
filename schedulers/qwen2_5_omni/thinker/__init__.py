"""Qwen2.5-Omni's thinker: :mod:`.model` (the text model and head: prefill, and decode for any rows of a
batch, returning what the talker needs)."""
