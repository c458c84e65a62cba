"""The code2wav stage: the talker's codes in, 24 kHz speech out as it is decoded, many requests per forward.

Per request the talker streams :class:`~schedulers.qwen3_omni.handoffs.Codes` chunks (frames in order)
and then its result, a :class:`~schedulers.qwen3_omni.handoffs.TalkerResult`, which ends the request.
What a consumer of this stage may rely on:

* ``stream`` outputs ``{"pcm": int16 array, "sample_rate": 24000}`` (``metadata={"modality": "audio"}``),
  in order, then one ``result`` ``{"num_samples", "num_frames", "sample_rate"}``.  Joined, the pcm is
  transformers' whole-utterance decode (``Qwen3OmniMoeCode2Wav.chunked_decode``, what ``generate``
  returns) of the same codes: exactly as long, and equal to it up to float rounding, converted as
  clip to [-1, 1], × 32767, round to nearest (:mod:`schedulers.qwen3_omni.code2wav.windows` says why).
* The first audio leaves once ``first_chunk_frames`` frames have arrived; later windows grow by
  ``ramp_factor`` up to ``chunk_frames``; the samples do not depend on how the talker split its chunks.
* Decoding runs whenever the inbox is empty, in steps: the windows that are ready, of every request,
  go through the convolutions in as few forwards as padding allows; the transformer runs per request on
  its KV cache.  A step reads about ``max_step_frames`` frames at most (a backlog waits for the next
  step, after the inbox is read again), requests that have not spoken yet first.
* A bad chunk, a ``num_frames`` that disagrees with the stream, or a model error fails only the
  requests it concerns (``error``).  Abort, failure and completion drop the request's codes and cache
  at once; chunks that arrive after an abort are dropped and never recreate them
  (:class:`~schedulers.vocoder.StreamingVocoderBase`).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

from omnitrio.contract import OutgoingMessage, StagePayload, put_messages
from schedulers.checkpoints import checked_by
from schedulers.devices import Placement
from schedulers.qwen3_omni.checkpoint import load_config, load_weights, preflight, require_model_dir
from schedulers.qwen3_omni.code2wav.model import DEFAULT_CALL_COST_FRAMES, Code2WavRunner, final_samples, to_pcm16
from schedulers.qwen3_omni.code2wav.warm_up import code2wav_warm_up
from schedulers.qwen3_omni.code2wav.windows import Chunking, CodeStream, Window
from schedulers.qwen3_omni.handoffs import Codes, TalkerResult
from schedulers.stepped_vocoder import SteppedVocoderBase
from schedulers.warm_up import with_warm_up

STAGE = "code2wav"
DEFAULT_FIRST_CHUNK_FRAMES = 5
DEFAULT_CHUNK_FRAMES = 25
DEFAULT_MAX_STEP_FRAMES = 320


class Qwen3OmniCode2WavScheduler(SteppedVocoderBase[CodeStream]):
    """Streaming, batched ``Qwen3OmniMoeCode2Wav`` (see the module docstring)."""

    sample_rate = 24_000
    stream_source_hint = STAGE
    stream_input_modality = None

    def __init__(
        self,
        model: Qwen3OmniMoeCode2Wav,
        chunking: Chunking,
        *,
        sample_rate: int = 24_000,
        max_step_frames: int = DEFAULT_MAX_STEP_FRAMES,
        call_cost_frames: int = DEFAULT_CALL_COST_FRAMES,
        max_forward_frames: int | None = None,
    ) -> None:
        super().__init__(sample_rate=sample_rate)
        if isinstance(max_step_frames, bool) or not isinstance(max_step_frames, int) or max_step_frames < 1:
            raise ValueError(f"{STAGE}: max_step_frames must be an integer >= 1, got {max_step_frames!r}")
        self.runner = Code2WavRunner(model, call_cost_frames=call_cost_frames, max_forward_frames=max_forward_frames)
        self.chunking = chunking
        self.max_step_frames = max_step_frames

    def warm_up_serving_thread(self) -> None:
        torch.set_num_threads(1)
        self.warm_up.run()

    # -- StreamingVocoderBase hooks --------------------------------------------------

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        return True  # the codes always come on the talker's stream

    def create_stream_state(self, request_id: str) -> CodeStream:
        return CodeStream(self.chunking, self.runner.geometry, self.runner.num_quantizers)

    def validate_chunk(self, request_id: str, state: CodeStream, codes: Any) -> torch.Tensor:
        return _codes_of(codes, request_id, self.runner.num_quantizers, self.runner.codebook_size)

    def ingest(self, request_id: str, state: CodeStream, codes: torch.Tensor) -> None:
        state.add(codes)

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage] | None:
        payload = self.stream_payloads[request_id]
        self._state(request_id).finish(_num_frames_of(payload, request_id))
        return None  # step completes it after its last window

    def final_result_data(self, request_id: str, payload: StagePayload, state: CodeStream) -> dict[str, Any]:
        return {"num_samples": state.samples_emitted, "num_frames": state.received, "sample_rate": self.sample_rate}

    def release_stream_resources(self, request_id: str, state: CodeStream) -> None:
        for segment in state.segments:
            segment.cache = segment.hidden = None
        state.segments.clear()

    # -- the decode step (scheduler thread) --------------------------------------------

    def step(self) -> bool:
        """Decode what is ready; True when more windows may be ready right away."""
        budget = self.max_step_frames
        windows: dict[str, list[Window]] = {}
        inputs: list[torch.Tensor] = []
        states = sorted(self._stream_states.items(), key=lambda item: item[1].samples_emitted > 0)
        for request_id, state in states:
            if budget <= 0:
                break
            taken = state.take_windows(budget)
            if not taken and not state.complete:
                continue
            try:
                inputs.extend(self.runner.transform(state, taken))
            except Exception as exc:
                self.fail_request(request_id, exc)
                continue
            windows[request_id] = taken
            budget -= sum(window.end - window.conv_start for window in taken)
        if not windows:
            return False
        try:
            waves = self.runner.waveforms(inputs) if inputs else []
        except Exception as exc:
            for request_id in windows:
                self.fail_request(request_id, exc)
            return budget <= 0
        self._emit_audio(windows, waves)
        return budget <= 0

    def _emit_audio(self, windows: dict[str, list[Window]], waves: list[torch.Tensor]) -> None:
        streamed: list[OutgoingMessage] = []
        position = 0
        for request_id, taken in windows.items():
            samples = final_samples(taken, waves[position : position + len(taken)])
            position += len(taken)
            state = self._stream_states.get(request_id)
            if state is None:
                continue
            pcm = to_pcm16(samples)
            state.samples_emitted += len(pcm)
            audio = [self._audio_message(request_id, pcm)] if len(pcm) else []
            streamed.extend(self.emit_step(request_id, state, audio))
        if streamed:
            put_messages(self.outbox, streamed)


def _codes_of(data: Any, request_id: str, num_quantizers: int, codebook_size: int) -> torch.Tensor:
    if not isinstance(data, Codes):
        raise ValueError(
            f"{STAGE}: a stream chunk for {request_id!r} must be Codes (Long[{num_quantizers}, n]), "
            f"got {type(data).__name__}"
        )
    tensor = data.codes
    if tensor.dtype.is_floating_point or tensor.dtype == torch.bool or tensor.is_complex():
        raise ValueError(f"{STAGE}: 'codes' of {request_id!r} must be integers, got {tensor.dtype}")
    if tensor.ndim != 2 or tensor.shape[0] != num_quantizers or tensor.shape[1] < 1:
        raise ValueError(
            f"{STAGE}: 'codes' of {request_id!r} must have shape [{num_quantizers}, n >= 1], got {list(tensor.shape)}"
        )
    if int(tensor.min()) < 0 or int(tensor.max()) >= codebook_size:
        raise ValueError(
            f"{STAGE}: 'codes' of {request_id!r} must lie in [0, {codebook_size}), got "
            f"[{int(tensor.min())}, {int(tensor.max())}]"
        )
    return tensor.to(torch.long)


def _num_frames_of(payload: StagePayload, request_id: str) -> int:
    data = payload.data
    if not isinstance(data, TalkerResult) or data.num_frames < 0:
        raise ValueError(
            f"{STAGE}: the talker's result for {request_id!r} must be a TalkerResult with num_frames >= 0, "
            f"got {data!r:.80}"
        )
    return data.num_frames


def load_code2wav(model_dir: str, placement: Placement = Placement()) -> Qwen3OmniMoeCode2Wav:
    """The checkpoint's code2wav, built on CPU in the placement's dtype (its rotary and code-offset
    buffers are not in the checkpoint), given the ``code2wav.`` tensors of the shards the index lists for
    them, then moved to the placement's device."""
    model = placement.build(Qwen3OmniMoeCode2Wav, load_config(model_dir).code2wav_config)
    load_weights(model_dir, "code2wav.", model)
    return placement.move(model)


@checked_by(preflight)
def create_code2wav_stage(
    *,
    model_dir: str | None = None,
    first_chunk_frames: int = DEFAULT_FIRST_CHUNK_FRAMES,
    chunk_frames: int = DEFAULT_CHUNK_FRAMES,
    reference_chunk_frames: int = 300,
    reference_left_context_frames: int = 25,
    ramp_factor: float = 1.5,
    sample_rate: int = 24_000,
    max_step_frames: int = DEFAULT_MAX_STEP_FRAMES,
    call_cost_frames: int = DEFAULT_CALL_COST_FRAMES,
    max_forward_frames: int | None = None,
    device: str = "cpu",
    dtype: str = "float32",
) -> Qwen3OmniCode2WavScheduler:
    """The code2wav stage of the checkpoint in ``model_dir``; only its ``code2wav.`` weights are read.

    ``reference_chunk_frames`` / ``reference_left_context_frames`` are the chunking of transformers'
    whole decode that the stream reproduces (300 / 25, what ``generate`` uses); 0 frames: one segment,
    no sample lost at any join.  ``max_forward_frames`` caps the frames of one convolution forward
    (default: 128 on CPU, 4096 on ``device`` "cuda").  ``device``/``dtype`` place the model
    (:mod:`schedulers.devices`); the pcm it streams does not depend on where it ran but through rounding.
    """
    placement = Placement.of(STAGE, device, dtype)
    torch.set_num_threads(1)
    chunking = Chunking(
        first_chunk_frames, chunk_frames, reference_chunk_frames, reference_left_context_frames, ramp_factor
    )
    scheduler = Qwen3OmniCode2WavScheduler(
        load_code2wav(require_model_dir(model_dir), placement),
        chunking,
        sample_rate=sample_rate,
        max_step_frames=max_step_frames,
        call_cost_frames=call_cost_frames,
        max_forward_frames=max_forward_frames,
    )
    return with_warm_up(scheduler, code2wav_warm_up)


__all__ = ["Qwen3OmniCode2WavScheduler", "create_code2wav_stage", "load_code2wav"]
