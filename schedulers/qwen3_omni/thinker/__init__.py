"""Qwen3-Omni's thinker: the stage, its batching engine, the language model, sampling, and the text decode stage."""
