"""Minimal stand-in for the ``sglang`` package, for benchmarking sglang-omni's pipeline core on CPU.

sglang-omni's runtime imports a few names from ``sglang`` at module level; the real package
pins a CUDA torch.  Only what the seed's toy pipelines reach is provided here.
"""
