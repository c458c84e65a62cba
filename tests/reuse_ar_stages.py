"""The AR family for test_reused_ids: the tiny Llama, its talker and the Griffin-Lim vocoder,
and the seed's talker (all import torch)."""

from __future__ import annotations

from omnitrio.contract import StagePayload
from schedulers.ar.scheduler import ARScheduler, create_tiny_ar_scheduler
from schedulers.ar.talker import TalkerScheduler, TinyTalker
from schedulers.ar.vocoder import GriffinLimVocoder, GriffinLimVocoderScheduler
from schedulers.simple import SimpleScheduler
from tests.reuse_stages import inputs_of
from tests.seed.ch4_stream_stages import ToyTalkerScheduler


def create_seed_talker(steps: int = 200) -> ToyTalkerScheduler:
    return ToyTalkerScheduler(steps=steps)


def create_tiny_ar() -> ARScheduler:
    return create_tiny_ar_scheduler(dim=64, n_layers=1, n_heads=4, n_kv_heads=1, max_seq_len=512, stream=True)


def talker_tokens(payload: StagePayload) -> StagePayload:
    payload.data = {"token_ids": list(inputs_of(payload)["token_ids"])}
    return payload


def create_talker_prep() -> SimpleScheduler:
    return SimpleScheduler(talker_tokens)


def create_talker() -> TalkerScheduler:
    return TalkerScheduler(TinyTalker(dim=32, frames_per_token=2), chunk_frames=4)


def create_griffin_lim() -> GriffinLimVocoderScheduler:
    return GriffinLimVocoderScheduler(GriffinLimVocoder(n_iter=1))
