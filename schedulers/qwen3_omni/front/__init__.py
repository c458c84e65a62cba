"""Qwen3-Omni's front: a chat request → the thinker's input (processor, preprocess stage, encoder stages, aggregate)."""
