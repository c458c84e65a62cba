"""The DiT's initial noise of one request, drawn frame by frame as transformers draws it whole.

transformers' ``Qwen2_5OmniToken2WavDiTModel.sample`` starts its ODE from ``torch.randn([1, 2·n, mel_dim])``,
the first draw after ``torch.manual_seed(seed)`` when thinker and talker are greedy: mel frame ``j``, channel
``c`` is element ``j·mel_dim + c`` of the CPU generator's float32 normal stream.  torch's CPU normal kernel
fills 16 values at a time, so while ``mel_dim`` is a multiple of 16 successive draws of whole frames
concatenate to that single draw, bit for bit.

A :class:`NoiseStream` owns a private ``torch.Generator("cpu")`` seeded with the request's seed (a shared
generator that other requests touch would move), draws frames on the CPU whatever device the DiT runs on
(CUDA's stream gives other values), and keeps only the frames a later window may still ask for.
"""

from __future__ import annotations

import torch

NOISE_BLOCK = 16


class NoiseStream:
    """Frames of one request's noise, ``[frames, mel_dim]`` float32 on the CPU, by absolute frame index."""

    def __init__(self, seed: int, mel_dim: int) -> None:
        if mel_dim % NOISE_BLOCK:
            raise ValueError(f"token2wav: mel_dim {mel_dim} is not a multiple of {NOISE_BLOCK}")
        self._generator = torch.Generator("cpu").manual_seed(seed)
        self.mel_dim = mel_dim
        self._frames = torch.zeros(0, mel_dim)
        self._first = 0  # absolute index of self._frames[0]

    @property
    def drawn(self) -> int:
        """How many frames have been drawn so far."""
        return self._first + self._frames.shape[0]

    def frames(self, start: int, end: int) -> torch.Tensor:
        """Frames ``[start, end)`` (drawn now if need be); ``start`` must not precede a :meth:`release`."""
        if start < self._first or end < start:
            raise ValueError(f"token2wav: noise frames [{start}, {end}) were released (kept from {self._first})")
        if end > self.drawn:
            more = torch.randn([end - self.drawn, self.mel_dim], generator=self._generator)
            self._frames = torch.cat([self._frames, more])
        return self._frames[start - self._first : end - self._first]

    def release(self, before: int) -> None:
        """Forget the frames before ``before``: no window will read them again."""
        drop = min(max(0, before - self._first), self._frames.shape[0])
        self._frames = self._frames[drop:]
        self._first += drop


__all__ = ["NOISE_BLOCK", "NoiseStream"]
