"""Where one request's token2wav decode stands: its codes, its noise, the windows in their ODE, the mel and
samples made final.

A :class:`SpeechStream` takes codes as they come (:meth:`add`, then :meth:`finish`), opens each chunk's DiT
window once the :class:`~.windows.Schedule` says it is ready (:meth:`open_windows`: its codes, its slice of
the request's noise, an :class:`~.ode.OdeWindow`), takes each window's mel when its ODE is done
(:meth:`window_done`), and hands BigVGAN the kept mel with its context, strictly in chunk order
(:meth:`vocoder_inputs`, the frames :mod:`.windows` names), keeping the final samples of its output
(:meth:`samples_of`).  Frames of codes, noise and mel no later step reads are released as the stream goes.

Not thread-safe: the scheduler thread owns every stream.
"""

from __future__ import annotations

import attrs
import torch

from schedulers.qwen2_5_omni.token2wav.model import Row, SpeakerCondition, Token2Wav
from schedulers.qwen2_5_omni.token2wav.noise import NoiseStream
from schedulers.qwen2_5_omni.token2wav.ode import OdeWindow
from schedulers.qwen2_5_omni.token2wav.windows import Chunk, Schedule
from schedulers.stepped_vocoder import talker_total


@attrs.define(eq=False)
class OpenWindow:
    """A chunk whose window is in its ODE; ``mel`` is set when the ODE is done."""

    chunk: Chunk
    codes: torch.Tensor
    ode: OdeWindow
    mel: torch.Tensor | None = None


@attrs.define(eq=False)
class SpeechStream:
    """One request's codes, noise, windows and output (module docstring)."""

    schedule: Schedule
    speaker: SpeakerCondition
    noise: NoiseStream
    points: torch.Tensor
    whole: bool = attrs.field(kw_only=True)
    _codes: torch.Tensor = attrs.field(init=False, factory=lambda: torch.zeros(0, dtype=torch.long))
    _codes_first: int = attrs.field(init=False, default=0)  # absolute index of self._codes[0]
    received: int = attrs.field(init=False, default=0)  # codes
    total: int | None = attrs.field(init=False, default=None)  # codes, once the stream has ended
    _next_chunk: int = attrs.field(init=False, default=0)
    windows: list[OpenWindow] = attrs.field(init=False, factory=list)  # in chunk order, not yet vocoded
    _kept: torch.Tensor = attrs.field(init=False)  # kept mel not yet vocoded, and context
    _kept_first: int = attrs.field(init=False, default=0)  # mel frame of self._kept[0]
    _emitted_to: int = attrs.field(init=False, default=0)  # mel frames whose samples were made
    _pending: list[int] = attrs.field(init=False, factory=list)  # frames of each vocoder input handed out, in order
    samples_emitted: int = attrs.field(init=False, default=0)

    @_kept.default
    def _no_mel_kept(self) -> torch.Tensor:
        return torch.zeros(0, self.noise.mel_dim, device=self.points.device)

    # -- input --------------------------------------------------------------------

    def add(self, codes: torch.Tensor) -> None:
        """Append validated codes ``Long[n]``; nothing may follow :meth:`finish`."""
        if self.total is not None:
            raise ValueError(f"token2wav: {codes.shape[0]} codes arrived after the stream's end")
        self._codes = torch.cat([self._codes, codes])
        self.received += int(codes.shape[0])

    def finish(self, num_codes: int) -> None:
        """The talker's end: ``num_codes`` codes in all (must equal those received)."""
        self.total = talker_total("token2wav", "codes", num_codes, self.received)

    # -- the DiT --------------------------------------------------------------------

    def open_windows(self) -> list[OpenWindow]:
        """The windows of the chunks that became ready, opened (in chunk order)."""
        repeats = self.schedule.repeats
        total = None if self.total is None else self.total * repeats
        opened: list[OpenWindow] = []
        while (
            chunk := self.schedule.chunk(self._next_chunk, self.received * repeats, total, whole=self.whole)
        ) is not None:
            codes = self._codes[
                chunk.window_start // repeats - self._codes_first : chunk.window_end // repeats - self._codes_first
            ]
            noise = self.noise.frames(chunk.window_start, chunk.window_end).to(self.points.device)
            ode = OdeWindow(noise, self.points)
            opened.append(OpenWindow(chunk, codes, ode))
            self._next_chunk += 1
            self._release(
                self.schedule.chunk_start(self._next_chunk) - self.schedule.block_size * self.schedule.past_blocks
            )
        self.windows.extend(opened)
        return opened

    def _release(self, before_frame: int) -> None:
        before = max(0, before_frame)
        self.noise.release(before)
        drop = min(before // self.schedule.repeats - self._codes_first, int(self._codes.shape[0]))
        if drop > 0:
            self._codes = self._codes[drop:]
            self._codes_first += drop

    @staticmethod
    def window_done(window: OpenWindow) -> None:
        """Record a window's mel once its ODE is done."""
        window.mel = window.ode.mel

    # -- BigVGAN --------------------------------------------------------------------

    def vocoder_inputs(self) -> list[tuple[int, torch.Tensor]]:
        """BigVGAN's work for each next chunk whose mel is ready, in order: ``(skip, mel)``, the input mel
        ``[frames, mel_dim]`` and how many of its first frames are context (:mod:`.windows` says which
        frames); :meth:`samples_of` keeps the final samples of its output.  The chunks are taken."""
        context, lag = self.schedule.vocoder_context, self.schedule.vocoder_lag
        work: list[tuple[int, torch.Tensor]] = []
        while self.windows and self.windows[0].mel is not None:
            window = self.windows.pop(0)
            chunk, mel = window.chunk, window.mel
            assert mel is not None
            self._kept = torch.cat([self._kept, mel[chunk.start - chunk.window_start : chunk.end - chunk.window_start]])
            emit_to = chunk.end if chunk.last else max(self._emitted_to, chunk.end - lag)
            if emit_to > self._emitted_to:
                begin = max(self._kept_first, self._emitted_to - context)
                ahead = mel[
                    chunk.end - chunk.window_start : min(chunk.window_end, emit_to + context) - chunk.window_start
                ]
                work.append((self._emitted_to - begin, torch.cat([self._kept[begin - self._kept_first :], ahead])))
                self._pending.append(emit_to - self._emitted_to)
                self._emitted_to = emit_to
            drop = max(0, self._emitted_to - context - self._kept_first)
            self._kept = self._kept[drop:]
            self._kept_first += drop
        return work

    def samples_of(self, skip: int, wave: torch.Tensor, frames: int) -> torch.Tensor:
        """The final samples out of BigVGAN's output ``wave`` for a :meth:`vocoder_inputs` item of ``frames``
        frames whose first ``skip`` are context."""
        per_frame = int(wave.shape[0]) // frames
        count = self._pending.pop(0)
        samples = wave[skip * per_frame : (skip + count) * per_frame]
        self.samples_emitted += int(samples.shape[0])
        return samples

    @property
    def complete(self) -> bool:
        """The stream has ended and every chunk's samples were taken."""
        if self.total is None or self.windows:
            return False
        total = self.total * self.schedule.repeats
        return self.schedule.chunk(self._next_chunk, total, total, whole=self.whole) is None

    def release(self) -> None:
        """Drop everything the stream holds (abort, failure, completion)."""
        self.windows.clear()
        self._codes = torch.zeros(0, dtype=torch.long)
        self._kept = self._kept[:0]
        self.noise.release(self.noise.drawn)


def decode(model: Token2Wav, stream: SpeechStream, codes: torch.Tensor) -> torch.Tensor:
    """``codes`` ``Long[n]`` through ``stream`` at once, one window at a time: the float samples a stage
    emits for them (for benchmarks and checks; the stage batches windows across requests instead)."""
    if codes.shape[0]:
        stream.add(codes)
    stream.finish(int(codes.shape[0]))
    pieces: list[torch.Tensor] = []
    while not stream.complete:
        for window in stream.open_windows():
            while not window.ode.done:
                time, x = window.ode.request()
                window.ode.advance(model.velocities([Row(x[0], time, window.codes, stream.speaker)])[0])
            stream.window_done(window)
        inputs = stream.vocoder_inputs()
        waves = model.vocode([mel for _, mel in inputs])
        pieces += [stream.samples_of(skip, wave, mel.shape[0]) for (skip, mel), wave in zip(inputs, waves, strict=True)]
    return torch.cat(pieces) if pieces else torch.zeros(0)


__all__ = ["OpenWindow", "SpeechStream", "decode"]
