"""Qwen3-Omni's code2wav: the stage, the vocoder run window by window, and the streaming window schedule."""
