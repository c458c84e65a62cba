"""The token2wav stage: the talker's codes in, 24 kHz speech out in chunks, many requests per DiT forward.

Per request the talker streams :class:`~schedulers.qwen2_5_omni.handoffs.TalkerCodes` chunks (the first
carries the request's :class:`~schedulers.qwen2_5_omni.handoffs.Voice`), then its result payload
:class:`~schedulers.qwen2_5_omni.handoffs.TalkerDone`, which ends the request.  What a consumer of this
stage may rely on:

* ``stream`` outputs ``{"pcm": float32 array in [-1, 1], "sample_rate": 24000}`` (``metadata={"modality":
  "audio"}``), in order, then one ``result`` ``{"num_samples", "num_codes", "sample_rate"}``.  Joined, the
  audio is exactly as long as transformers' whole decode of the same codes (``generate``'s audio).
* ``voice.stream`` False: one decode of all codes once they have ended, equal to ``generate``'s audio for
  the same speaker and seed (the same operations; float rounding apart when other requests share the
  forward).  True: chunks in the release's streaming scheme (:mod:`.windows`); the first audio leaves
  once the first chunk's window has arrived and its ODE has run.  A chunk's samples never depend on how
  the talker split its codes or which other requests shared a forward (up to float rounding).
* Decoding runs whenever the inbox is empty, one DiT evaluation per step for each request's earliest
  window still in its ODE (its audio leaves in chunk order, so a later window would only slow the step
  that finishes the earliest); the requests' windows share forwards (shorter windows padded,
  :func:`plan_forwards`), so a new request's window joins at the next step.  Finished chunks go through
  BigVGAN together (``max_vocoder_frames`` at a time).
* A bad chunk, a ``num_codes`` that disagrees with the stream, an unknown speaker or a model error fails
  only the requests it concerns (``error``).  Abort, failure and completion drop the request's codes,
  noise and windows at once; chunks that arrive after an abort are dropped and never recreate them
  (:class:`~schedulers.vocoder.StreamingVocoderBase`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
import numpy as np
import torch

from omnitrio.contract import OutgoingMessage, StagePayload, put_messages
from schedulers.checkpoints import checked_by
from schedulers.qwen2_5_omni.checkpoint import Speakers, preflight, require_model_dir, speakers
from schedulers.qwen2_5_omni.handoffs import TalkerCodes, TalkerDone, Voice
from schedulers.qwen2_5_omni.token2wav.model import Row, SpeakerCondition, Token2Wav
from schedulers.qwen2_5_omni.token2wav.noise import NoiseStream
from schedulers.qwen2_5_omni.token2wav.stream import SpeechStream, decode
from schedulers.qwen2_5_omni.token2wav.windows import (
    DEFAULT_CHUNK_BLOCKS,
    DEFAULT_FIRST_CHUNK_BLOCKS,
    DEFAULT_FUTURE_BLOCKS,
    DEFAULT_PAST_BLOCKS,
    DEFAULT_RAMP_FACTOR,
    DEFAULT_VOCODER_CONTEXT,
    DEFAULT_VOCODER_LAG,
    Schedule,
    check_count,
)
from schedulers.stepped_vocoder import SteppedVocoderBase

STAGE = "token2wav"
SAMPLE_RATE = 24_000
DEFAULT_CALL_COST_FRAMES = 32
# Frames (rows x padded length) per DiT forward: on CPU a batch that outgrows the caches is no faster than
# its rows apart; an accelerator wants the whole batch.
CPU_MAX_FORWARD_FRAMES = 2304
ACCELERATOR_MAX_FORWARD_FRAMES = 65536
# Mel frames per BigVGAN forward: its activations are hundreds of samples per frame, so on CPU a batch of long
# pieces costs more than the pieces one by one.
CPU_MAX_VOCODER_FRAMES = 256
ACCELERATOR_MAX_VOCODER_FRAMES = 65536


@attrs.frozen
class FrameBudget:
    """How the stage groups its work, in mel frames: ``call_cost_frames`` and ``max_forward_frames`` shape
    the DiT forwards (:func:`plan_forwards`), ``max_vocoder_frames`` bounds one BigVGAN call; each an
    integer >= 0 (``ValueError`` naming it otherwise)."""

    call_cost_frames: int
    max_forward_frames: int
    max_vocoder_frames: int

    def __attrs_post_init__(self) -> None:
        for field in attrs.fields(FrameBudget):
            check_count(field.name, getattr(self, field.name), 0)


class Token2WavScheduler(SteppedVocoderBase[SpeechStream | None]):
    """Streaming, batched Qwen2.5-Omni token2wav (see the module docstring)."""

    sample_rate = SAMPLE_RATE
    stream_source_hint = STAGE
    stream_input_modality = None

    def __init__(
        self,
        model: Token2Wav,
        voices: Speakers,
        schedule: Schedule,
        *,
        call_cost_frames: int = DEFAULT_CALL_COST_FRAMES,
        max_forward_frames: int | None = None,
        max_vocoder_frames: int | None = None,
        threads: int = 1,
    ) -> None:
        super().__init__(sample_rate=SAMPLE_RATE)
        self.threads = check_count("threads", threads, 1)
        on_cpu = model.device.type == "cpu"
        if max_forward_frames is None:
            max_forward_frames = CPU_MAX_FORWARD_FRAMES if on_cpu else ACCELERATOR_MAX_FORWARD_FRAMES
        if max_vocoder_frames is None:
            max_vocoder_frames = CPU_MAX_VOCODER_FRAMES if on_cpu else ACCELERATOR_MAX_VOCODER_FRAMES
        self.budget = FrameBudget(call_cost_frames, max_forward_frames, max_vocoder_frames)
        self.model = model
        self.voices = voices
        self.schedule = schedule
        self._conditions: dict[str, SpeakerCondition] = {}

    def warm_up_serving_thread(self) -> None:
        """Every speaker's conditioning, and one block of codes decoded: the first request pays no first-run
        cost."""
        torch.set_num_threads(self.threads)
        for name in self.voices:
            self._condition(name)
        condition = self._condition(self.voices.names[0])
        noise = NoiseStream(0, self.model.mel_dim)
        stream = SpeechStream(self.schedule, condition, noise, self.model.points, whole=True)
        decode(self.model, stream, torch.zeros(self.schedule.block_size // self.schedule.repeats, dtype=torch.long))

    # -- StreamingVocoderBase hooks --------------------------------------------------

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        return True  # the codes always come on the talker's stream

    def create_stream_state(self, request_id: str) -> SpeechStream | None:
        return None  # opened by the first chunk's voice (or the result's, for a request without codes)

    def _state(self, request_id: str) -> SpeechStream | None:
        self._stream_states.setdefault(request_id, None)
        return self._stream_states[request_id]

    def validate_chunk(self, request_id: str, state: SpeechStream | None, codes: Any) -> TalkerCodes:
        if not isinstance(codes, TalkerCodes):
            raise TypeError(
                f"{STAGE}: a stream chunk for {request_id!r} must be TalkerCodes, got {type(codes).__name__}"
            )
        tensor = codes.codes
        if not isinstance(tensor, torch.Tensor) or tensor.ndim != 1 or tensor.shape[0] < 1:
            raise ValueError(f"{STAGE}: the codes of {request_id!r} must be a tensor Long[n >= 1]")
        if tensor.dtype.is_floating_point or tensor.dtype == torch.bool or tensor.is_complex():
            raise ValueError(f"{STAGE}: the codes of {request_id!r} must be integers, got {tensor.dtype}")
        vocab = self.model.code_vocab
        if int(tensor.min()) < 0 or int(tensor.max()) >= vocab:
            raise ValueError(
                f"{STAGE}: the codes of {request_id!r} must lie in [0, {vocab}), got [{int(tensor.min())}, "
                f"{int(tensor.max())}]"
            )
        if state is None and codes.voice is None:
            raise ValueError(f"{STAGE}: the first chunk of {request_id!r} carries no voice")
        return codes

    def ingest(self, request_id: str, state: SpeechStream | None, codes: TalkerCodes) -> None:
        if state is None:
            assert codes.voice is not None
            state = self._open(request_id, codes.voice)
        state.add(codes.codes.to(torch.long).cpu())

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage] | None:
        done = self.stream_payloads[request_id].data
        if not isinstance(done, TalkerDone) or isinstance(done.num_codes, bool) or done.num_codes < 0:
            raise ValueError(f"{STAGE}: the talker's result for {request_id!r} must be TalkerDone, got {done!r:.80}")
        state = self._stream_states.get(request_id)
        if state is None:
            if done.num_codes:
                raise ValueError(f"{STAGE}: {request_id!r} says {done.num_codes} codes but its stream carried none")
            state = self._open(request_id, done.voice or Voice(self.voices.names[0], 0))
        state.finish(done.num_codes)
        return None  # step completes it after its last chunk

    def final_result_data(self, request_id: str, payload: StagePayload, state: SpeechStream | None) -> dict[str, Any]:
        assert state is not None
        return {"num_samples": state.samples_emitted, "num_codes": state.total, "sample_rate": self.sample_rate}

    def release_stream_resources(self, request_id: str, state: SpeechStream | None) -> None:
        if state is not None:
            state.release()

    def _condition(self, name: str) -> SpeakerCondition:
        speaker = self.voices.lookup(name)
        condition = self._conditions.get(speaker.name)
        if condition is None:
            condition = self._conditions[speaker.name] = self.model.condition(speaker)
        return condition

    def _open(self, request_id: str, voice: Voice) -> SpeechStream:
        noise = NoiseStream(int(voice.seed), self.model.mel_dim)
        state = SpeechStream(
            self.schedule, self._condition(voice.speaker), noise, self.model.points, whole=not voice.stream
        )
        self._stream_states[request_id] = state
        return state

    # -- the decode step (scheduler thread) --------------------------------------------

    def step(self) -> bool:
        """Open ready windows, run one DiT evaluation for each request's earliest window in its ODE, vocode
        finished chunks, complete finished requests; True while windows remain in their ODE."""
        streams = {rid: state for rid, state in self._stream_states.items() if state is not None}
        for request_id, state in streams.items():
            self._guard(request_id, state.open_windows)
        self._evaluate(streams)
        self._vocode(streams)
        return any(not window.ode.done for state in self._live_streams() for window in state.windows)

    def _live_streams(self) -> Iterable[SpeechStream]:
        return (state for state in self._stream_states.values() if state is not None)

    def _evaluate(self, streams: dict[str, SpeechStream]) -> None:
        active = []
        for request_id, state in sorted(streams.items(), key=lambda item: item[1].samples_emitted > 0):
            window = next((window for window in state.windows if not window.ode.done), None)
            if window is not None:  # a request's audio leaves in chunk order: its earliest window first
                active.append((request_id, window))
        lengths = [window.chunk.window_frames for _, window in active]
        for forward in plan_forwards(lengths, self.budget.call_cost_frames, self.budget.max_forward_frames):
            taken = [active[index] for index in forward]
            rows = []
            for request_id, window in taken:
                time, x = window.ode.request()
                rows.append(Row(x[0], time, window.codes, streams[request_id].speaker))
            try:
                slopes = self.model.velocities(rows)
            except Exception as exc:
                for request_id in {rid for rid, _ in taken}:
                    self.fail_request(request_id, exc)
                continue
            for (_, window), slope in zip(taken, slopes, strict=True):
                window.ode.advance(slope)
                if window.ode.done:
                    SpeechStream.window_done(window)

    def _vocode(self, streams: dict[str, SpeechStream]) -> None:
        taken: list[tuple[str, int, torch.Tensor]] = []
        for request_id, state in streams.items():
            if self._stream_states.get(request_id) is state:
                taken.extend((request_id, skip, mel) for skip, mel in state.vocoder_inputs())
        waves: list[torch.Tensor] = []
        if taken:
            try:
                waves = self.model.vocode([mel for _, _, mel in taken], self.budget.max_vocoder_frames)
            except Exception as exc:
                for request_id in {rid for rid, _, _ in taken}:
                    self.fail_request(request_id, exc)
                return
        audio: dict[str, list[torch.Tensor]] = {}
        for (request_id, skip, mel), wave in zip(taken, waves, strict=True):
            audio.setdefault(request_id, []).append(streams[request_id].samples_of(skip, wave, int(mel.shape[0])))
        streamed: list[OutgoingMessage] = []
        for request_id, state in streams.items():
            if self._stream_states.get(request_id) is not state:
                continue
            pieces = audio.get(request_id, [])
            messages = [self._audio_message(request_id, _samples(pieces))] if pieces else []
            streamed.extend(self.emit_step(request_id, state, messages))
        if streamed:
            put_messages(self.outbox, streamed)

    def _guard(self, request_id: str, hook: Callable[[], object]) -> None:
        try:
            hook()
        except Exception as exc:
            self.fail_request(request_id, exc)


def plan_forwards(lengths: Sequence[int], call_cost_frames: int, max_forward_frames: int) -> list[list[int]]:
    """Rows (indices into ``lengths``, in frames) per DiT forward, longest first: a row joins the forward
    being filled while padding it to that forward's longest row costs at most ``call_cost_frames`` frames
    (what one more forward costs) and the forward stays within ``max_forward_frames``; a row alone always
    fits.  Among rows of one length the earlier index goes first."""
    forwards: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lambda row: -lengths[row]):
        if forwards:
            forward = forwards[-1]
            longest = lengths[forward[0]]
            if longest - lengths[index] <= call_cost_frames and (len(forward) + 1) * longest <= max_forward_frames:
                forward.append(index)
                continue
        forwards.append([index])
    return forwards


def _samples(pieces: list[torch.Tensor]) -> np.ndarray:
    return torch.cat(pieces).detach().cpu().numpy().astype(np.float32, copy=False)


@checked_by(preflight)
def create_token2wav_stage(
    *,
    model_dir: str | None = None,
    first_chunk_blocks: int = DEFAULT_FIRST_CHUNK_BLOCKS,
    chunk_blocks: int = DEFAULT_CHUNK_BLOCKS,
    ramp_factor: float = DEFAULT_RAMP_FACTOR,
    past_blocks: int = DEFAULT_PAST_BLOCKS,
    future_blocks: int = DEFAULT_FUTURE_BLOCKS,
    vocoder_context: int = DEFAULT_VOCODER_CONTEXT,
    vocoder_lag: int = DEFAULT_VOCODER_LAG,
    call_cost_frames: int = DEFAULT_CALL_COST_FRAMES,
    max_forward_frames: int | None = None,
    max_vocoder_frames: int | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    threads: int = 1,
) -> Token2WavScheduler:
    """The token2wav stage of the checkpoint in ``model_dir``; only its ``token2wav.`` weights are read.

    Chunk sizes and context are in DiT blocks (the configuration's ``block_size`` mel frames, two per
    code); ``vocoder_context`` and ``vocoder_lag`` in mel frames (:mod:`.windows`).  ``device`` places the
    DiT and BigVGAN; ``dtype`` only BigVGAN (the DiT's ODE runs in float32, as transformers runs it).
    ``call_cost_frames`` and ``max_forward_frames`` shape the DiT forwards (:func:`plan_forwards`; the
    latter defaults to 2304 on CPU and 65536 on an accelerator); ``max_vocoder_frames`` bounds BigVGAN's
    forwards likewise (256 on CPU, 65536 on an accelerator).  ``threads``: torch's intra-op threads for the
    DiT and BigVGAN on CPU (1: every process of the pipeline shares the cores; more pays off when token2wav
    has the cores to itself).
    """
    torch.set_num_threads(check_count("threads", threads, 1))
    directory = require_model_dir(model_dir)
    model = Token2Wav.from_checkpoint(directory, device=device, dtype=dtype)
    schedule = Schedule(
        model.block_size,
        model.repeats,
        first_chunk_blocks=first_chunk_blocks,
        chunk_blocks=chunk_blocks,
        past_blocks=past_blocks,
        future_blocks=future_blocks,
        vocoder_context=vocoder_context,
        vocoder_lag=vocoder_lag,
        ramp_factor=ramp_factor,
    )
    return Token2WavScheduler(
        model,
        speakers(directory),
        schedule,
        call_cost_frames=call_cost_frames,
        max_forward_frames=max_forward_frames,
        max_vocoder_frames=max_vocoder_frames,
        threads=threads,
    )


__all__ = ["SAMPLE_RATE", "Token2WavScheduler", "create_token2wav_stage"]
