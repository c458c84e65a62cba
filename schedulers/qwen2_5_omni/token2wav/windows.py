"""Which mel frames each streamed chunk of Qwen2.5-Omni's token2wav decodes, and with what context.

transformers decodes the whole code sequence at once: the DiT's ODE over all ``2·n`` mel frames (``repeats``
mel frames per code), then BigVGAN over the whole mel.  The release streams it in chunks instead; a
:class:`Schedule` says how, in mel frames:

* chunk ``k`` covers mel frames ``[start, end)``: the first ``first_chunk_blocks`` DiT blocks (``block_size``
  frames each, from the configuration), each next chunk ``ramp_factor`` times the last, up to
  ``chunk_blocks`` (a small first chunk for the first audio; large later ones spend less of the DiT on
  context: a window computes ``past + chunk + future`` blocks to keep ``chunk``); the last chunk ends
  where the codes end.  Chunk boundaries are block boundaries, so a chunk's audio never depends on how the talker
  split its codes;
* the DiT runs on the chunk's *window*: ``past_blocks`` blocks before it and ``future_blocks`` blocks after
  it (cut at the sequence's ends), with that window's slice of the request's noise; the chunk's frames are
  kept.  A window starts on a block boundary, so its block-local attention sees the blocks the whole
  decode sees; a window that reaches both ends of the sequence *is* the whole decode;
* BigVGAN, with ``vocoder_context`` frames of context on each side whose samples are dropped: once chunk
  ``k`` is kept, the samples of frames ``[previous end, end − vocoder_lag)`` are made (up to the sequence's
  end for the last chunk); the context before them is kept frames, the context after them kept frames and
  then the window's own future frames.  Holding back ``vocoder_lag`` frames keeps BigVGAN's nearest
  right context exact; its receptive field is about ``vocoder_context`` frames.  The joined audio is
  exactly as long as the whole decode's.

A chunk is *ready* once the codes up to its window's end have arrived, or the stream has ended.  With
``whole=True`` (a request that asked not to stream) there is one chunk, ready at the stream's end: the
whole decode.  Pure arithmetic: nothing here touches a model or a tensor.
"""

from __future__ import annotations

import math

import attrs

DEFAULT_FIRST_CHUNK_BLOCKS = 1
DEFAULT_CHUNK_BLOCKS = 8
DEFAULT_RAMP_FACTOR = 2.0
DEFAULT_PAST_BLOCKS = 2
DEFAULT_FUTURE_BLOCKS = 1
DEFAULT_VOCODER_CONTEXT = 24
DEFAULT_VOCODER_LAG = 12


def check_count(name: str, value: int, minimum: int) -> int:
    """``value``, an integer (not a bool) >= ``minimum``; a ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"token2wav: {name} must be an integer >= {minimum}, got {value!r}")
    return value


@attrs.frozen
class Chunk:
    """Mel frames ``[start, end)`` kept from the DiT's window ``[window_start, window_end)``; ``last`` when
    it ends the sequence."""

    index: int
    start: int
    end: int
    window_start: int
    window_end: int
    last: bool

    @property
    def window_frames(self) -> int:
        return self.window_end - self.window_start


@attrs.frozen
class Schedule:
    """How a stream is cut (module docstring); frames are mel frames, ``repeats`` of them per code."""

    block_size: int
    repeats: int
    first_chunk_blocks: int = DEFAULT_FIRST_CHUNK_BLOCKS
    chunk_blocks: int = DEFAULT_CHUNK_BLOCKS
    past_blocks: int = DEFAULT_PAST_BLOCKS
    future_blocks: int = DEFAULT_FUTURE_BLOCKS
    vocoder_context: int = DEFAULT_VOCODER_CONTEXT
    vocoder_lag: int = DEFAULT_VOCODER_LAG
    ramp_factor: float = DEFAULT_RAMP_FACTOR

    def __attrs_post_init__(self) -> None:
        if isinstance(self.ramp_factor, bool) or not isinstance(self.ramp_factor, int | float) or self.ramp_factor < 1:
            raise ValueError(f"token2wav: ramp_factor must be a number >= 1, got {self.ramp_factor!r}")
        for name in ("block_size", "repeats", "first_chunk_blocks", "chunk_blocks"):
            check_count(name, getattr(self, name), 1)
        for name in ("past_blocks", "future_blocks", "vocoder_context", "vocoder_lag"):
            check_count(name, getattr(self, name), 0)
        if self.block_size % self.repeats:
            raise ValueError(f"token2wav: block_size {self.block_size} is not a multiple of repeats {self.repeats}")

    def chunk_blocks_of(self, index: int) -> int:
        """DiT blocks of chunk ``index``: the first chunk's, grown by ``ramp_factor`` per chunk up to
        ``chunk_blocks``."""
        size = self.first_chunk_blocks
        for _ in range(index):
            if size >= self.chunk_blocks:
                return self.chunk_blocks
            size = min(self.chunk_blocks, math.ceil(size * self.ramp_factor))
        return size

    def chunk_start(self, index: int) -> int:
        """First mel frame of chunk ``index`` when the sequence is long enough."""
        return self.block_size * sum(self.chunk_blocks_of(i) for i in range(index))

    def chunk(self, index: int, received: int, total: int | None, *, whole: bool = False) -> Chunk | None:
        """Chunk ``index`` if it is ready, given ``received`` mel frames so far and ``total`` once the stream
        has ended (None before); None if it is not ready yet or lies past the end."""
        if whole:
            if index or total is None or total == 0:
                return None
            return Chunk(0, 0, total, 0, total, True)
        start = self.chunk_start(index)
        if total is not None and start >= total:
            return None
        end = start + self.block_size * self.chunk_blocks_of(index)
        window_end = end + self.block_size * self.future_blocks
        if total is not None:
            end, window_end = min(end, total), min(window_end, total)
        elif received < window_end:
            return None
        window_start = max(0, start - self.block_size * self.past_blocks)
        return Chunk(index, start, end, window_start, window_end, total is not None and end >= total)


__all__ = [
    "DEFAULT_CHUNK_BLOCKS",
    "DEFAULT_FIRST_CHUNK_BLOCKS",
    "DEFAULT_FUTURE_BLOCKS",
    "DEFAULT_PAST_BLOCKS",
    "DEFAULT_RAMP_FACTOR",
    "DEFAULT_VOCODER_CONTEXT",
    "DEFAULT_VOCODER_LAG",
    "Chunk",
    "Schedule",
]
