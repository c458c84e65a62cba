"""Qwen3-Omni (transformers' ``qwen3_omni_moe``) as stages: preprocessing, encoders, thinker, talker, code2wav.

:mod:`.checkpoint` reads a checkpoint directory; each stage loads only the weights of the part it runs.
"""
