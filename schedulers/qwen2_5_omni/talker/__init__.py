"""Qwen2.5-Omni's talker: :mod:`.model` (the talker and its thinker rows), :mod:`.prompt` (its input from the
thinker's stream, as ``generate`` builds it) and :mod:`.codec_sampling` (the next code, as ``generate`` picks
it)."""
