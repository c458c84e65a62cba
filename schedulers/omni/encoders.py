"""Tiny audio and image encoders (random weights from a seed) and the features they read.

They do what Qwen3-Omni's encoders do, at toy scale: turn a clip or an image into a sequence of
embeddings for the thinker.  Our thinker (:mod:`schedulers.ar`) takes token ids only, so each
encoder ends in a *codebook*: every output embedding is also quantized to its nearest code, and the
codes (``code + CODE_OFFSET`` as token ids, clear of ``<eos>``) stand for the clip or image in the
prompt.  Different audio or images therefore give the thinker different prompts.

* audio: log-mel ``[frames, n_mels]`` (25 ms window, 10 ms hop at 16 kHz) → two stride-2 convolutions
  (4x fewer frames) → one transformer layer → at most ``max_tokens`` embeddings (average-pooled);
* image: RGB ``[3, 32, 32]`` → 8x8 patches → linear + position embeddings → one transformer layer.

Both batch: :meth:`TinyAudioEncoder.encode_batch` pads clips and masks the padding, so a clip's
output does not depend on what it was batched with.  Two encoders built from equal arguments are
identical.  Not thread-safe; one scheduler thread owns each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from schedulers.ar.vocoder import mel_filterbank

CODE_OFFSET = 1  # token id of code 0; id 0 is <eos>
AUDIO_RATE = 16_000
N_FFT = 400
HOP = 160


class LogMel:
    """Log-mel features of 16 kHz float audio: ``[frames, n_mels]`` float32, one frame per 10 ms."""

    def __init__(self, n_mels: int = 64) -> None:
        self.n_mels = n_mels
        self._bank = mel_filterbank(AUDIO_RATE, N_FFT, n_mels)
        self._window = torch.hann_window(N_FFT)

    def __call__(self, samples: np.ndarray) -> np.ndarray:
        audio = torch.as_tensor(samples, dtype=torch.float32)
        if len(audio) < N_FFT:
            audio = torch.nn.functional.pad(audio, (0, N_FFT - len(audio)))
        with torch.inference_mode():
            spectrum = torch.stft(audio, N_FFT, HOP, window=self._window, center=True, return_complex=True)
            mel = self._bank @ spectrum.abs().pow(2)
            return torch.log(mel + 1e-6).T.contiguous().numpy()


def _seeded(seed: int, build: Callable[[], nn.Module]) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build().eval()


def _layer(dim: int, heads: int) -> nn.TransformerEncoderLayer:
    return nn.TransformerEncoderLayer(dim, heads, dim * 2, dropout=0.0, batch_first=True, norm_first=True)


class _Quantizer(nn.Module):
    def __init__(self, dim: int, codebook_size: int) -> None:
        super().__init__()
        self.codebook = nn.Parameter(torch.randn(codebook_size, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Nearest code per row of ``x [..., dim]`` (cosine)."""
        x = nn.functional.normalize(x, dim=-1)
        return (x @ nn.functional.normalize(self.codebook, dim=-1).T).argmax(-1)


class TinyAudioEncoder(nn.Module):
    """Log-mel frames → embeddings ``[n, dim]`` and codes ``[n]`` (see the module docstring)."""

    def __init__(self, n_mels: int = 64, dim: int = 64, heads: int = 4, codebook_size: int = 256) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(n_mels, dim, 3, stride=2, padding=1)
        self.conv2 = nn.Conv1d(dim, dim, 3, stride=2, padding=1)
        self.layer = _layer(dim, heads)
        self.quantizer = _Quantizer(dim, codebook_size)

    @classmethod
    def build(cls, seed: int = 0, **kwargs: int) -> TinyAudioEncoder:
        return _seeded(seed, lambda: cls(**kwargs))  # type: ignore[return-value]

    def encode_batch(self, clips: Sequence[np.ndarray], max_tokens: int) -> list[tuple[np.ndarray, list[int]]]:
        """Per clip (``[frames, n_mels]``): ``(embeddings float32 [n, dim], codes)``, ``n <= max_tokens``."""
        lengths = [max(1, len(c)) for c in clips]
        width = max(lengths)
        feats = torch.zeros(len(clips), width, clips[0].shape[1])
        for i, clip in enumerate(clips):
            feats[i, : len(clip)] = torch.as_tensor(clip)
        with torch.inference_mode():
            x = nn.functional.gelu(self.conv1(feats.transpose(1, 2)))
            x = nn.functional.gelu(self.conv2(x)).transpose(1, 2)  # [B, T/4, dim]
            out_lengths = [(n + 3) // 4 for n in lengths]
            pad = torch.arange(x.shape[1])[None] >= torch.tensor(out_lengths)[:, None]
            x = self.layer(x, src_key_padding_mask=pad if len(clips) > 1 else None)
            results = []
            for i, n in enumerate(out_lengths):
                emb = x[i, :n]
                if n > max_tokens:
                    emb = nn.functional.adaptive_avg_pool1d(emb.T[None], max_tokens)[0].T
                results.append((emb.numpy().astype(np.float32), self.quantizer(emb).tolist()))
            return results


class TinyImageEncoder(nn.Module):
    """RGB ``[3, size, size]`` → embeddings ``[(size / patch)^2, dim]`` and codes (module docstring)."""

    def __init__(self, size: int = 32, patch: int = 8, dim: int = 64, heads: int = 4, codebook_size: int = 256) -> None:
        super().__init__()
        if size % patch:
            raise ValueError(f"TinyImageEncoder: size={size} is not a multiple of patch={patch}")
        self.size = size
        self.patch = patch
        self.embed = nn.Linear(3 * patch * patch, dim)
        self.position = nn.Parameter(torch.randn((size // patch) ** 2, dim) * 0.1)
        self.layer = _layer(dim, heads)
        self.quantizer = _Quantizer(dim, codebook_size)

    @classmethod
    def build(cls, seed: int = 0, **kwargs: int) -> TinyImageEncoder:
        return _seeded(seed, lambda: cls(**kwargs))  # type: ignore[return-value]

    def encode_batch(self, images: Sequence[np.ndarray]) -> list[tuple[np.ndarray, list[int]]]:
        """Per image: ``(embeddings float32 [patches, dim], codes)``."""
        for image in images:
            if image.shape != (3, self.size, self.size):
                raise ValueError(f"image features must be [3, {self.size}, {self.size}], got {list(image.shape)}")
        pixels = torch.as_tensor(np.stack(images), dtype=torch.float32)
        b, p = len(images), self.patch
        patches = pixels.unfold(2, p, p).unfold(3, p, p)  # [B, 3, H/p, W/p, p, p]
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(b, -1, 3 * p * p)
        with torch.inference_mode():
            x = self.layer(self.embed(patches) + self.position)
            return [(x[i].numpy().astype(np.float32), self.quantizer(x[i]).tolist()) for i in range(b)]
