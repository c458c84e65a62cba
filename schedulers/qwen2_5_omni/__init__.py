"""Qwen2.5-Omni (transformers' ``qwen2_5_omni``) as stages: its checkpoint, token2wav, and (to come) front,
thinker and talker.

:mod:`.checkpoint` reads a checkpoint directory (each stage loads only the weights of the part it runs);
:mod:`.handoffs` holds what the stages hand each other; :mod:`.token2wav` turns the talker's codes into
speech; :mod:`.tiny` writes random checkpoints in the release's layout for tests and benchmarks.
"""
