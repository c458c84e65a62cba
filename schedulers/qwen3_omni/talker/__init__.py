"""Qwen3-Omni's talker: the stage, one request's life, its prompt, the model, the code predictor, codec sampling."""
