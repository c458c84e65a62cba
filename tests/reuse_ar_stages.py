"""The AR family for test_reused_ids: the tiny Llama and the seed's talker (both import torch)."""

from __future__ import annotations

from schedulers.ar.scheduler import ARScheduler, create_tiny_ar_scheduler
from toys.seed.ch4_stream_stages import ToyTalkerScheduler


def create_seed_talker(steps: int = 200) -> ToyTalkerScheduler:
    return ToyTalkerScheduler(steps=steps)


def create_tiny_ar() -> ARScheduler:
    return create_tiny_ar_scheduler(dim=64, n_layers=1, n_heads=4, n_kv_heads=1, max_seq_len=512, stream=True)
