"""Where one request's code2wav decode stands: which frames to decode next and which samples are final.

transformers' whole-utterance decode (``Qwen3OmniMoeCode2Wav.chunked_decode``, what ``generate`` calls)
cuts the codes into *reference segments* of ``reference_chunk_frames`` (300) frames; segment k > 0 is
decoded with ``reference_left_context_frames`` (25) frames before it, whose samples it drops, and every
segment's decode of n frames lacks the causal tail (n·1920 − 555 samples).  So T frames give
``T·1920 − 555·ceil(T/300)`` samples: the joins of the reference itself lose the tail.

A :class:`CodeStream` reproduces exactly that signal, chunk by chunk, as codes arrive:

* each reference segment is streamed on its own, from its own first frame, as transformers decodes it;
* inside a segment, frames are decoded in *windows* at fixed frame boundaries, so the samples never
  depend on how the codes were split into chunks on the way here: the first segment's windows start at
  ``first_chunk_frames`` and grow by ``ramp_factor`` up to ``chunk_frames`` (a small first chunk, then a
  ramp: a talker faster than real time by more than ``ramp_factor`` delivers each window before the
  audio already out has played, so the listener hears no gap), later segments' are ``chunk_frames``;
  the segment's end closes the last one;
* a window of new frames [a, b) emits the samples [a·1920 − 555, b·1920 − 555) of its segment: those
  before b·1920 − 555 need no later frame (the model is causal and its transposed convolutions trim what
  a later frame would change), and the 555 samples a window cannot finish are emitted by the next window,
  or never (the segment's end), as in the reference;
* the transformer before the convolutions keeps its state across windows (the decoder's KV cache, see
  :mod:`schedulers.qwen3_omni.code2wav.model`), and the convolutions re-read ``conv_context_frames`` of
  its output before each window: their whole receptive field, so every emitted sample is the reference's
  up to float rounding.

Nothing here touches the model; :class:`Window` carries what the decoder needs.  Not thread-safe: the
scheduler thread owns every stream.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import torch

from schedulers.stepped_vocoder import talker_total


@attrs.frozen
class Chunking:
    """How a stream is cut: the first window's frames, then every later window's; the reference segments."""

    first_chunk_frames: int
    chunk_frames: int
    reference_chunk_frames: int = 300
    reference_left_context_frames: int = 25
    ramp_factor: float = 1.5

    def __attrs_post_init__(self) -> None:
        if isinstance(self.ramp_factor, bool) or not isinstance(self.ramp_factor, int | float) or self.ramp_factor < 1:
            raise ValueError(f"code2wav: ramp_factor must be a number >= 1, got {self.ramp_factor!r}")
        for name in ("first_chunk_frames", "chunk_frames"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"code2wav: {name} must be an integer >= 1, got {value!r}")
        for name in ("reference_chunk_frames", "reference_left_context_frames"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"code2wav: {name} must be an integer >= 0, got {value!r}")

    def segment_start(self, index: int) -> int:
        """Absolute first frame of reference segment ``index`` (its left context included)."""
        begin = index * self.reference_chunk_frames
        return begin - min(self.reference_left_context_frames, begin)

    def segment_count(self, num_frames: int) -> int:
        """How many reference segments ``num_frames`` frames make."""
        if self.reference_chunk_frames == 0:
            return 1 if num_frames > 0 else 0
        return -(-num_frames // self.reference_chunk_frames)


@attrs.frozen
class Geometry:
    """What the model fixes: samples per frame, the causal tail, the convolutions' reach in frames."""

    samples_per_frame: int
    tail_samples: int
    conv_context_frames: int

    def num_samples(self, num_frames: int, chunking: Chunking) -> int:
        """Length of transformers' whole decode of ``num_frames`` frames."""
        return num_frames * self.samples_per_frame - chunking.segment_count(num_frames) * self.tail_samples


@attrs.define(eq=False)
class Segment:
    """One reference segment being streamed; ``cache`` and ``hidden`` belong to the decoder."""

    index: int
    start: int
    skip: int
    end: int | None = None
    next_size: int = 0
    planned_to: int = attrs.field(default=-1)
    cache: Any = None
    hidden: torch.Tensor | None = None
    hidden_start: int = 0

    def __attrs_post_init__(self) -> None:
        if self.planned_to < 0:
            self.planned_to = self.start
            self.hidden_start = self.start

    @property
    def done(self) -> bool:
        return self.end is not None and self.planned_to >= self.end


@attrs.frozen
class Window:
    """New frames [start, end) of ``segment``; the convolutions read from ``conv_start``; the samples
    ``[emit_from, emit_to)`` of their output are final."""

    segment: Segment
    start: int
    end: int
    conv_start: int
    emit_from: int
    emit_to: int


class CodeStream:
    """One request's codes (``Long[Q, n]`` chunks, in frame order) and the windows still to decode."""

    def __init__(self, chunking: Chunking, geometry: Geometry, num_quantizers: int) -> None:
        self.chunking = chunking
        self.geometry = geometry
        self.num_quantizers = num_quantizers
        self._chunks: list[torch.Tensor] = []
        self._codes: torch.Tensor = torch.zeros(num_quantizers, 0, dtype=torch.long)
        self.received = 0
        self.total: int | None = None
        self.segments: list[Segment] = []
        self._next_segment = 0
        self.samples_emitted = 0

    # -- input ------------------------------------------------------------------------

    def add(self, codes: torch.Tensor) -> None:
        """Append validated frames; after :meth:`finish` nothing may be added."""
        if self.total is not None:
            raise ValueError(f"code2wav: {codes.shape[-1]} frames arrived after the stream's end")
        self._chunks.append(codes)
        self.received += int(codes.shape[-1])

    def finish(self, num_frames: int) -> None:
        """The talker's end of speech: ``num_frames`` frames in all (must equal those received)."""
        self.total = talker_total("code2wav", "frames", num_frames, self.received)

    def codes(self, start: int, end: int) -> torch.Tensor:
        """Frames [start, end) as ``Long[Q, end - start]``."""
        if self._chunks:
            self._codes = torch.cat([self._codes, *self._chunks], dim=-1)
            self._chunks.clear()
        return self._codes[:, start:end]

    # -- planning ---------------------------------------------------------------------

    @property
    def complete(self) -> bool:
        """Every sample has been planned (the stream ended and its last window was taken)."""
        if self.total is None:
            return False
        self._open_segments()
        return self._next_segment >= self.chunking.segment_count(self.total) and not self.segments

    def take_windows(self, max_frames: int) -> list[Window]:
        """Windows whose frames have all arrived, in emission order (marked as taken), while the frames
        the convolutions read stay within ``max_frames`` (one window at least)."""
        self._open_segments()
        windows: list[Window] = []
        frames = 0
        for segment in self.segments:
            while (not windows or frames < max_frames) and (window := self._next_window(segment)) is not None:
                windows.append(window)
                frames += window.end - window.conv_start
        self.segments = [segment for segment in self.segments if not segment.done]
        return windows

    def _open_segments(self) -> None:
        chunking = self.chunking
        known = self.received if self.total is None else self.total
        while self._next_segment < chunking.segment_count(known) and (
            self.total is not None or known > self._next_segment * chunking.reference_chunk_frames
        ):
            index = self._next_segment
            start = chunking.segment_start(index)
            first = chunking.first_chunk_frames if index == 0 else chunking.chunk_frames
            skip = index * chunking.reference_chunk_frames - start
            self.segments.append(Segment(index, start, skip, next_size=first))
            self._next_segment += 1
        size = chunking.reference_chunk_frames
        for segment in self.segments:
            if segment.end is not None:
                continue
            limit = (segment.index + 1) * size
            if size and self.received >= limit:
                segment.end = limit
            elif self.total is not None:
                segment.end = self.total

    def _next_window(self, segment: Segment) -> Window | None:
        """The segment's next window if its frames have all arrived (taken), else None."""
        start = segment.planned_to
        if segment.done:
            return None
        end = start + segment.next_size + (segment.skip if start == segment.start else 0)
        if segment.end is not None:
            end = min(end, segment.end)
        if end > self.received:
            return None
        geometry = self.geometry
        per_frame, tail = geometry.samples_per_frame, geometry.tail_samples
        first_emitted = segment.start + segment.skip if start == segment.start else start
        conv_start = max(segment.start, first_emitted - geometry.conv_context_frames)
        emit_from = (first_emitted - conv_start) * per_frame - (tail if start > segment.start else 0)
        segment.planned_to = end
        steady, size = self.chunking.chunk_frames, segment.next_size
        segment.next_size = min(steady, math.ceil(size * self.chunking.ramp_factor)) if size < steady else steady
        return Window(segment, start, end, conv_start, emit_from, (end - conv_start) * per_frame - tail)


__all__ = ["Chunking", "CodeStream", "Geometry", "Segment", "Window"]
