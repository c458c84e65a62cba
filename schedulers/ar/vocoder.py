"""Griffin-Lim vocoder in plain torch (log-mel frames → 24 kHz audio), whole or chunk by chunk.

A mel frame is ``log(mel magnitude)`` with ``n_mels`` bins; frame ``i`` owns samples
``[i * hop, (i + 1) * hop)``, so ``T`` frames always become exactly ``T * hop`` samples, whether decoded
at once or streamed in chunks.  Streaming (:class:`StreamingGriffinLim`) re-decodes each chunk with
``context`` frames of left context (whose phases it keeps, for continuity) and holds back the last
``lookahead`` frames, whose samples still depend on frames not yet seen, until the next chunk or
:meth:`~StreamingGriffinLim.flush`.

:class:`GriffinLimVocoderScheduler` is the stage, a :class:`~schedulers.vocoder.StreamingVocoderBase`:
``stream_chunk`` (data: a ``{"mel": [frames, n_mels]}`` dict or the array itself) are decoded as they
arrive, also before the request's payload; ``stream_done`` plus the payload flush the tail and produce
the result; abort drops the state, and late chunks of an aborted or finished request never recreate it.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np
import torch

from omnitrio.contract import StagePayload
from schedulers.vocoder import StreamingVocoderBase


def mel_filterbank(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None
) -> torch.Tensor:
    """Triangular HTK-mel filters ``[n_mels, n_fft // 2 + 1]``."""
    fmax = fmax or sample_rate / 2

    def to_mel(f: torch.Tensor) -> torch.Tensor:
        return 2595.0 * torch.log10(1.0 + f / 700.0)

    def to_hz(m: torch.Tensor) -> torch.Tensor:
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    freqs = torch.linspace(0, sample_rate / 2, n_fft // 2 + 1, dtype=torch.float64)
    edges = to_hz(torch.linspace(float(to_mel(torch.tensor(fmin))), float(to_mel(torch.tensor(fmax))), n_mels + 2))
    lower, center, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (freqs - lower) / (center - lower)
    falling = (upper - freqs) / (upper - center)
    return torch.clamp(torch.minimum(rising, falling), min=0.0).float()


@attrs.define(eq=False)
class GriffinLimVocoder:
    """Stateless decoder: :meth:`decode` turns ``[T, n_mels]`` log-mel frames into ``T * hop`` samples."""

    sample_rate: int = 24000
    n_fft: int = 1024
    hop: int = 256
    n_mels: int = 80
    n_iter: int = 16
    seed: int = 0
    _inverse: torch.Tensor = attrs.field(init=False)
    _window: torch.Tensor = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._inverse = torch.linalg.pinv(mel_filterbank(self.sample_rate, self.n_fft, self.n_mels))
        self._window = torch.hann_window(self.n_fft)

    def magnitude(self, mel_frames: torch.Tensor) -> torch.Tensor:
        """Linear magnitude ``[freq, T]`` from log-mel frames ``[T, n_mels]`` (pseudo-inverse, clamped)."""
        if mel_frames.dim() != 2 or mel_frames.shape[1] != self.n_mels:
            raise ValueError(f"mel frames must be [frames, {self.n_mels}], got {list(mel_frames.shape)}")
        return torch.clamp(self._inverse @ mel_frames.float().exp().T, min=0.0)

    def griffin_lim(self, magnitude: torch.Tensor, phase: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``n_iter`` Griffin-Lim iterations from ``phase``; returns ``(audio [T * hop], phase [freq, T])``."""
        frames = magnitude.shape[1]
        length = frames * self.hop
        for _ in range(self.n_iter):
            audio = self._istft(magnitude * phase, length)
            spectrum = torch.stft(audio, self.n_fft, self.hop, window=self._window, center=True, return_complex=True)[
                :, :frames
            ]
            phase = spectrum / spectrum.abs().clamp(min=1e-8)
        return self._istft(magnitude * phase, length), phase

    def initial_phase(self, freq: int, frames: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed + frames)
        return torch.exp(2j * math.pi * torch.rand(freq, frames, generator=generator))

    def decode(self, mel_frames: torch.Tensor | np.ndarray) -> np.ndarray:
        """Float32 audio in [-1, 1], ``len(mel_frames) * hop`` samples."""
        magnitude = self.magnitude(torch.as_tensor(mel_frames))
        audio, _ = self.griffin_lim(magnitude, self.initial_phase(*magnitude.shape))
        return audio.clamp(-1.0, 1.0).numpy().astype(np.float32)

    def _istft(self, spectrum: torch.Tensor, length: int) -> torch.Tensor:
        return torch.istft(spectrum, self.n_fft, self.hop, window=self._window, center=True, length=length)


class StreamingGriffinLim:
    """Per-request streaming state over a :class:`GriffinLimVocoder` (see the module docstring)."""

    def __init__(self, vocoder: GriffinLimVocoder, context: int = 8, lookahead: int = 4) -> None:
        self.vocoder = vocoder
        self.context = context
        self.lookahead = lookahead
        self._mel = torch.zeros(0, vocoder.n_mels)
        self._phase: torch.Tensor | None = None  # phases of the frames in _mel, from the last decode
        self._emitted = 0  # frames at the start of _mel whose samples were already emitted

    def push(self, mel_frames: torch.Tensor) -> np.ndarray:
        """Add frames; returns the samples that are now final (possibly none)."""
        self._mel = torch.cat([self._mel, torch.as_tensor(mel_frames, dtype=torch.float32)])
        ready = len(self._mel) - self.lookahead
        if ready <= self._emitted:
            return np.zeros(0, np.float32)
        audio = self._decode()
        out = audio[self._emitted * self.vocoder.hop : ready * self.vocoder.hop]
        drop = max(0, ready - self.context)
        self._mel = self._mel[drop:]
        assert self._phase is not None
        self._phase = self._phase[:, drop:]
        self._emitted = ready - drop
        return out

    def flush(self) -> np.ndarray:
        """The remaining samples; the state is empty afterwards."""
        if len(self._mel) <= self._emitted:
            return np.zeros(0, np.float32)
        out = self._decode()[self._emitted * self.vocoder.hop :]
        self._mel, self._phase, self._emitted = self._mel[:0], None, 0
        return out

    def _decode(self) -> np.ndarray:
        magnitude = self.vocoder.magnitude(self._mel)
        phase = self.vocoder.initial_phase(*magnitude.shape)
        if self._phase is not None:
            phase[:, : self._phase.shape[1]] = self._phase
        audio, self._phase = self.vocoder.griffin_lim(magnitude, phase)
        return audio.clamp(-1.0, 1.0).numpy().astype(np.float32)


def to_pcm16(audio: np.ndarray) -> np.ndarray:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)


@attrs.define(eq=False)
class _Stream:
    """One request's vocoder state: the streaming decoder, samples ready to emit, and all emitted so far."""

    decoder: StreamingGriffinLim
    ready: list[np.ndarray] = attrs.field(factory=list)
    pcm: list[np.ndarray] = attrs.field(factory=list)

    def add(self, samples: np.ndarray) -> None:
        if len(samples):
            self.ready.append(to_pcm16(samples))


def _mel_of(data: Any) -> torch.Tensor:
    match data:
        case {"mel": mel}:
            return torch.as_tensor(np.asarray(mel) if not isinstance(mel, torch.Tensor) else mel, dtype=torch.float32)
        case torch.Tensor() | np.ndarray():
            return torch.as_tensor(data, dtype=torch.float32)
        case _:
            raise ValueError(
                f"vocoder stream chunk must be {{'mel': [frames, n_mels]}} or an array, got {type(data).__name__}"
            )


def _has_mel(payload: StagePayload) -> bool:
    return isinstance(payload.data, dict) and "mel" in payload.data


class GriffinLimVocoderScheduler(StreamingVocoderBase[_Stream]):
    """Streaming vocoder stage: mel chunks in, ``{"pcm": int16, "sample_rate"}`` audio chunks out.

    Per request, in order: ``stream`` outputs (``metadata={"modality": "audio"}``), one per chunk that
    yielded samples, then the tail chunk and a ``result`` once both the payload and ``stream_done``
    arrived.  The result's payload ``data`` (a dict) gets ``pcm`` (all samples, int16),
    ``sample_rate`` and ``num_samples``.  A payload whose ``data`` holds ``"mel"`` is decoded whole
    (no stream needed); every other payload is streaming.  A bad chunk fails only its request (``error``).
    Chunk metadata may name modality ``"mel"`` (what the talker sends) or none.
    """

    stream_source_hint = "GriffinLimVocoder"
    stream_input_modality = "mel"

    def __init__(self, vocoder: GriffinLimVocoder | None = None, *, context: int = 8, lookahead: int = 4) -> None:
        self.vocoder = vocoder or GriffinLimVocoder()
        self.context = context
        self.lookahead = lookahead
        super().__init__(self._decode_whole, sample_rate=self.vocoder.sample_rate)

    @property
    def active_requests(self) -> int:
        return self.active_streams

    def warm_up_serving_thread(self) -> None:
        torch.set_num_threads(1)

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        return not _has_mel(payload)

    def create_stream_state(self, request_id: str) -> _Stream:
        return _Stream(StreamingGriffinLim(self.vocoder, self.context, self.lookahead))

    def validate_chunk(self, request_id: str, state: _Stream, codes: Any) -> torch.Tensor:
        return _mel_of(codes)

    def ingest(self, request_id: str, state: _Stream, codes: torch.Tensor) -> None:
        state.add(state.decoder.push(codes))

    def decode_delta(self, request_id: str, state: _Stream, *, is_final: bool) -> np.ndarray | None:
        if is_final:
            state.add(state.decoder.flush())
        if not state.ready:
            return None
        pcm = np.concatenate(state.ready)
        state.ready.clear()
        state.pcm.append(pcm)
        return pcm

    def final_result_data(self, request_id: str, payload: StagePayload, state: _Stream) -> dict[str, Any]:
        pcm = np.concatenate(state.pcm) if state.pcm else np.zeros(0, np.int16)
        return _with_audio(payload, pcm, self.vocoder.sample_rate)

    def _decode_whole(self, payload: StagePayload) -> StagePayload:
        pcm = to_pcm16(self.vocoder.decode(_mel_of(payload.data)))
        payload.data = _with_audio(payload, pcm, self.vocoder.sample_rate)
        return payload


def _with_audio(payload: StagePayload, pcm: np.ndarray, sample_rate: int) -> dict[str, Any]:
    result = {"pcm": pcm, "sample_rate": sample_rate, "num_samples": len(pcm)}
    return {**payload.data, **result} if isinstance(payload.data, dict) else result
