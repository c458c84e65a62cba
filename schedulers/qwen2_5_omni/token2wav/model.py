"""transformers' Qwen2.5-Omni token2wav modules (the DiT and BigVGAN) run for many windows at once.

``Qwen2_5OmniToken2WavModel.forward`` samples the DiT's ODE over the whole code sequence (one guided
evaluation = a batch of two: conditioned, and unconditioned with ``cond``, ``ref_mel`` and every code
zeroed, combined as ``g + guidance·(g − u)``), then runs BigVGAN on the mel.  :class:`Token2Wav` keeps
those modules and their numbers (10 steps, guidance 0.5, sway −1: ``forward``'s defaults) and offers the
two halves to a scheduler:

* :meth:`Token2Wav.velocities`: one guided evaluation for any number of windows of any speakers, each at its
  own time and of its own length: the rows are stacked as transformers stacks its batch (all conditioned
  rows, then all unconditioned ones; shorter ones padded, out of the real frames' reach) and go through
  the DiT's own submodules.  The speaker encoder's
  output depends only on the speaker, so :meth:`Token2Wav.condition` computes it once (on the batch of two
  ``sample`` gives it) instead of in every evaluation;
* :meth:`Token2Wav.vocode`: BigVGAN on mel frames, several pieces of one length per forward (up to a bound).

The DiT runs in float32, as transformers runs it (``token2wav.float()``); ``device`` places both modules,
``dtype`` only BigVGAN.  Loaded from a checkpoint, only the ``token2wav.`` tensors are read.  One thread
at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
    Qwen2_5OmniToken2WavModel,
)

from schedulers.devices import Placement
from schedulers.qwen2_5_omni.checkpoint import Speaker, load_config, load_weights
from schedulers.qwen2_5_omni.token2wav.ode import time_points

NUM_STEPS = 10
GUIDANCE_SCALE = 0.5
SWAY_COEFFICIENT = -1.0


@attrs.frozen(eq=False)
class SpeakerCondition:
    """A speaker as the DiT reads it: ``cond`` ``[D]`` and the speaker encoder's output for its reference
    mel and for the zeroed one (``[enc_dim]`` each), on the model's device."""

    name: str
    cond: torch.Tensor
    reference: torch.Tensor
    no_reference: torch.Tensor


@attrs.frozen(eq=False)
class Row:
    """One window's next evaluation: its state ``x`` ``[frames, mel_dim]``, its time (0-dim), its codes
    ``[frames / repeats]`` and its speaker."""

    x: torch.Tensor
    time: torch.Tensor
    codes: torch.Tensor
    speaker: SpeakerCondition


class Token2Wav:
    """The DiT and BigVGAN of one checkpoint (module docstring)."""

    def __init__(
        self,
        dit: Any,
        bigvgan: Any,
        *,
        num_steps: int = NUM_STEPS,
        guidance_scale: float = GUIDANCE_SCALE,
        sway_coefficient: float | None = SWAY_COEFFICIENT,
    ) -> None:
        self.dit: Any = dit.eval()  # Qwen2_5OmniToken2WavDiTModel
        self.bigvgan: Any = bigvgan.eval()  # Qwen2_5OmniToken2WavBigVGANModel
        config = dit.config
        self.mel_dim = int(config.mel_dim)
        self.repeats = int(config.repeats)
        self.block_size = int(config.block_size)
        self.code_vocab = int(config.num_embeds) + 1
        self.samples_per_frame = int(torch.tensor(bigvgan.config.upsample_rates).prod())
        self.guidance_scale = guidance_scale
        self.device = next(dit.parameters()).device
        self.points = time_points(num_steps, sway_coefficient, self.device)

    @classmethod
    def from_checkpoint(cls, model_dir: str | Path, *, device: str = "cpu", dtype: str = "float32") -> Token2Wav:
        """The checkpoint's token2wav (only its ``token2wav.`` tensors read), placed on ``device``."""
        placement = Placement.of("token2wav", device, dtype)
        config = load_config(model_dir).token2wav_config
        model = Qwen2_5OmniToken2WavModel._from_config(config, attn_implementation="sdpa")
        load_weights(model_dir, "token2wav.", model)
        dit, bigvgan = model.code2wav_dit_model, model.code2wav_bigvgan_model
        dit.to(device=placement.device, dtype=torch.float32)
        bigvgan.to(device=placement.device, dtype=placement.dtype)
        return cls(dit, bigvgan)

    @torch.inference_mode()
    def condition(self, speaker: Speaker) -> SpeakerCondition:
        """The speaker's conditioning, its reference mel encoded as ``sample``'s batch of two encodes it."""
        ref_mel = speaker.ref_mel.to(self.device, torch.float32)
        encoded = self.dit.input_embed.spk_encoder(torch.cat([ref_mel, torch.zeros_like(ref_mel)]))
        cond = speaker.cond.to(self.device, torch.float32)[0]
        return SpeakerCondition(speaker.name, cond, encoded[0], encoded[1])

    @torch.inference_mode()
    def velocities(self, rows: Sequence[Row]) -> list[torch.Tensor]:
        """The guided velocity ``[1, frames, mel_dim]`` of each row, in one DiT forward.

        Rows of unequal length are padded at the end; a padded frame is a key no real frame attends to
        (:meth:`_block_diff`), so each row's velocity is its own forward's up to float rounding."""
        dit = self.dit
        lengths = [int(row.x.shape[0]) for row in rows]
        frames = max(lengths)
        times = torch.stack([row.time for row in rows])
        codes = torch.stack([_pad(row.codes, frames // self.repeats) for row in rows]).to(self.device)
        x = torch.stack([_pad(row.x, frames) for row in rows]).to(self.device)
        cond = torch.stack([row.speaker.cond for row in rows]).unsqueeze(1).repeat(1, frames, 1)
        reference = torch.stack([row.speaker.reference for row in rows] + [row.speaker.no_reference for row in rows])
        time = dit.time_embed(torch.cat([times, times]))
        code_embed = torch.cat([dit.text_embed(codes, drop_code=False), dit.text_embed(codes, drop_code=True)])
        hidden = dit.input_embed.proj(
            torch.cat(
                (
                    torch.cat([x, x]),
                    reference.unsqueeze(1).repeat(1, frames, 1),
                    code_embed,
                    torch.cat([cond, torch.zeros_like(cond)]),
                ),
                dim=-1,
            )
        )
        positions = torch.arange(frames, device=self.device)[None, :].repeat(hidden.shape[0], 1)
        position_embeddings = dit.rotary_embed(hidden, positions)
        block_diff = self._block_diff(hidden, lengths + lengths)
        for block in dit.transformer_blocks:
            hidden = block(hidden, time, position_embeddings=position_embeddings, block_diff=block_diff)
        out = dit.proj_out(dit.norm_out(hidden, time))
        guided, unguided = torch.chunk(out, 2, dim=0)
        velocity = guided + (guided - unguided) * self.guidance_scale
        return [velocity[index : index + 1, :length] for index, length in enumerate(lengths)]

    def _block_diff(self, hidden: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """The DiT's block distance of each key from each query (``_create_block_diff``'s values), as float
        and broadcast over rows and heads where it can be (each layer compares it with its reach, so an
        integer tensor per head would be converted and compared per head).  Past a row's length, keys are
        out of every layer's reach but for the padded queries themselves (whose output is dropped)."""
        frames = hidden.shape[1]
        blocks = torch.arange(frames, device=hidden.device) // self.block_size
        block_diff = (blocks[None, :] - blocks[:, None]).to(torch.float32)[None, None]  # [1, 1, query, key]
        if min(lengths) == frames:
            return block_diff
        positions = torch.arange(frames, device=hidden.device)
        padded = positions[None, :] >= torch.tensor(lengths, device=hidden.device)[:, None]  # [rows, keys]
        beyond = padded[:, None, :] & ~padded[:, :, None]  # a real query, a padded key
        return torch.where(beyond[:, None], float(frames), block_diff)

    @torch.inference_mode()
    def vocode(self, mels: Sequence[torch.Tensor], max_frames: int | None = None) -> list[torch.Tensor]:
        """BigVGAN's waveform (float32, CPU, clamped to [-1, 1]) of each mel ``[frames, mel_dim]``; mels of one
        length share a forward, up to ``max_frames`` frames in all (a mel alone always fits; None: no bound).
        On a CPU a forward past its caches costs more than its mels one by one."""
        out: list[torch.Tensor] = [torch.empty(0)] * len(mels)
        groups: list[list[int]] = []
        open_groups: dict[int, list[int]] = {}
        for index, mel in enumerate(mels):
            frames = int(mel.shape[0])
            group = open_groups.get(frames)
            if group is None or (max_frames is not None and (len(group) + 1) * frames > max_frames):
                group = open_groups[frames] = []
                groups.append(group)
            group.append(index)
        dtype = next(self.bigvgan.parameters()).dtype
        for indices in groups:
            batch = torch.stack([mels[i] for i in indices]).to(self.device, dtype).permute(0, 2, 1)
            waves = self.bigvgan(batch).float().reshape(len(indices), -1)
            for slot, index in enumerate(indices):
                out[index] = waves[slot]
        return out


def _pad(tensor: torch.Tensor, length: int) -> torch.Tensor:
    """``tensor`` zero-padded at the end of its first dimension to ``length``."""
    missing = length - int(tensor.shape[0])
    if missing == 0:
        return tensor
    return torch.cat([tensor, tensor.new_zeros((missing, *tensor.shape[1:]))])


__all__ = ["GUIDANCE_SCALE", "NUM_STEPS", "SWAY_COEFFICIENT", "Row", "SpeakerCondition", "Token2Wav"]
