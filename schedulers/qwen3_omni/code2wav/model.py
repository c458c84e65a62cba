"""transformers' ``Qwen3OmniMoeCode2Wav`` run window by window: its transformer with a KV cache, its
convolutions batched across requests.

``Qwen3OmniMoeCode2Wav.forward`` is: code embedding (mean over the code groups) → ``pre_transformer``
(causal, sliding-window attention) → ``upsample`` → ``decoder`` → clamp to [-1, 1].  :class:`Code2WavRunner`
runs the same modules in two halves:

* :meth:`Code2WavRunner.hidden`: embedding and transformer for new frames only, on the segment's own
  KV cache (positions counted from the segment's first frame, as a whole forward counts them), so its
  output equals the whole forward's;
* :meth:`Code2WavRunner.waveforms`: the convolutions on windows of transformer output, several windows
  (of any requests) per forward.  Windows of unequal length are padded on the *right* with zeros: every
  layer is causal, so padding after a window never changes its samples (padding before it would).
  Windows are grouped by length so that padding stays cheap, up to ``max_forward_frames`` frames per
  forward (:func:`plan_groups`).

:func:`geometry` derives from the modules (not from constants) how many samples a frame makes, the
causal tail a decode lacks, and how many frames of transformer output the convolutions reach back.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
import torch
from transformers.cache_utils import DynamicCache
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeCausalConvNet,
    Qwen3OmniMoeCausalTransConvNet,
    Qwen3OmniMoeCode2Wav,
)

from schedulers.qwen3_omni.code2wav.windows import Chunking, CodeStream, Geometry, Window

DEFAULT_CALL_COST_FRAMES = 8
# Frames per convolution forward: on CPU a batch whose activations outgrow the caches decodes slower than
# its rows one by one; an accelerator wants the whole batch.
CPU_MAX_FORWARD_FRAMES = 128
ACCELERATOR_MAX_FORWARD_FRAMES = 4096


@attrs.frozen
class _Conv:
    """One causal convolution after the transformer: ``stride`` 1 (plain) or a transposed one."""

    transposed: bool
    kernel: int
    stride: int
    left_pad: int = 0
    right_pad: int = 0


def _conv_layers(model: Qwen3OmniMoeCode2Wav) -> list[_Conv]:
    """The causal (transposed) convolutions after the transformer, in forward order."""
    layers: list[_Conv] = []
    for part in (model.upsample, model.decoder):
        for module in part.modules():
            if isinstance(module, Qwen3OmniMoeCausalConvNet):
                if module.stride != 1:
                    raise ValueError(f"code2wav: a strided causal convolution ({module.stride}) is not supported")
                layers.append(_Conv(False, int(module.kernel_size), 1))
            elif isinstance(module, Qwen3OmniMoeCausalTransConvNet):
                conv = module.conv
                assert isinstance(conv, torch.nn.ConvTranspose1d)
                kernel, stride = int(conv.kernel_size[0]), int(conv.stride[0])
                layers.append(_Conv(True, kernel, stride, int(module.left_pad), int(module.right_pad)))
    return layers


def _output_length(layers: Sequence[_Conv], frames: int) -> int:
    length = frames
    for layer in layers:
        if layer.transposed:
            length = (length - 1) * layer.stride + layer.kernel - layer.left_pad - layer.right_pad
    return length


def _lowest_input_frame(layers: Sequence[_Conv], sample: int) -> int:
    """The earliest frame of transformer output that output ``sample`` depends on (may be negative)."""
    position = sample
    for layer in reversed(layers):
        if layer.transposed:
            # raw output r = position + left_pad reads inputs i with r - kernel < i * stride <= r
            position = (position + layer.left_pad - layer.kernel) // layer.stride + 1
        else:
            position -= layer.kernel - 1
    return position


def geometry(model: Qwen3OmniMoeCode2Wav) -> Geometry:
    """Samples per frame, the tail a decode of n frames lacks (n·spf − tail samples), the convolutions'
    left reach in frames (the context before a window that makes its samples exact)."""
    layers = _conv_layers(model)
    per_frame = int(model.total_upsample)
    tail = per_frame - _output_length(layers, 1)
    if per_frame * 2 - _output_length(layers, 2) != tail or not 0 <= tail < per_frame:
        raise ValueError(f"code2wav: the decoder's tail is not a constant under one frame ({tail} samples)")
    context = 0
    while _lowest_input_frame(layers, context * per_frame - tail) < 0:
        context += 1
    return Geometry(samples_per_frame=per_frame, tail_samples=tail, conv_context_frames=context)


def plan_groups(lengths: Sequence[int], call_cost_frames: int, max_frames: int) -> list[list[int]]:
    """Rows (indices into ``lengths``) per forward: sorted by length, cut where padding to the group's
    longest row would cost more frames than another call (``call_cost_frames``) or the group would hold
    more than ``max_frames`` frames (a single row always fits)."""
    order = sorted(range(len(lengths)), key=lambda row: lengths[row])
    sizes = [lengths[row] for row in order]
    inf = float("inf")
    best = [0.0] + [inf] * len(order)
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        for start in range(end):
            rows = end - start
            if rows > 1 and rows * sizes[end - 1] > max_frames:
                continue
            cost = best[start] + call_cost_frames + rows * sizes[end - 1]
            if cost < best[end]:
                best[end], cut[end] = cost, start
    groups: list[list[int]] = []
    end = len(order)
    while end > 0:
        groups.append(order[cut[end] : end])
        end = cut[end]
    return groups[::-1]


class Code2WavRunner:
    """The model's two halves (see the module docstring); one thread at a time."""

    def __init__(
        self,
        model: Qwen3OmniMoeCode2Wav,
        *,
        call_cost_frames: int = DEFAULT_CALL_COST_FRAMES,
        max_forward_frames: int | None = None,
    ) -> None:
        self.model = model.eval()
        self.geometry = geometry(model)
        self.num_quantizers = int(model.config.num_quantizers)
        self.codebook_size = int(model.config.codebook_size)
        self.call_cost_frames = call_cost_frames
        if max_forward_frames is None:
            on_cpu = model.code_offset.device.type == "cpu"
            max_forward_frames = CPU_MAX_FORWARD_FRAMES if on_cpu else ACCELERATOR_MAX_FORWARD_FRAMES
        self.max_forward_frames = max_forward_frames
        self._layers = _conv_layers(model)

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def hidden(self, cache: DynamicCache, codes: torch.Tensor, position: int) -> torch.Tensor:
        """Transformer output ``[n, hidden]`` for ``codes`` ``Long[Q, n]`` at ``position`` (frames already
        in ``cache``, counted from the segment's first frame)."""
        model = self.model
        codes = codes.to(model.code_offset.device)
        embeds = model.code_embedding(codes.unsqueeze(0) + model.code_offset).mean(1)
        positions = torch.arange(position, position + codes.shape[-1], device=codes.device).unsqueeze(0)
        out = model.pre_transformer(
            inputs_embeds=embeds, past_key_values=cache, use_cache=True, position_ids=positions
        ).last_hidden_state
        return out[0]

    @torch.inference_mode()
    def waveforms(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The convolutions' output (float, clamped to [-1, 1]) for each ``[n_i, hidden]`` input:
        ``n_i · samples_per_frame − tail`` samples each, in order."""
        outputs: list[torch.Tensor] = [torch.empty(0)] * len(inputs)
        lengths = [int(x.shape[0]) for x in inputs]
        for group in plan_groups(lengths, self.call_cost_frames, self.max_forward_frames):
            longest = max(lengths[row] for row in group)
            batch = inputs[0].new_zeros(len(group), longest, inputs[0].shape[-1])
            for slot, row in enumerate(group):
                batch[slot, : lengths[row]] = inputs[row]
            wav = self._convolve(batch.permute(0, 2, 1))
            for slot, row in enumerate(group):
                outputs[row] = wav[slot, 0, : _output_length(self._layers, lengths[row])]
        return outputs

    def transform(self, stream: CodeStream, windows: Sequence[Window]) -> list[torch.Tensor]:
        """Run the transformer over each window's new frames, in order; the convolutions' input per window.

        Keeps, per segment, the cache and the last ``conv_context_frames`` of output; drops both after
        the segment's last window."""
        keep = self.geometry.conv_context_frames
        inputs = []
        for window in windows:
            segment = window.segment
            if segment.cache is None:
                segment.cache = self.new_cache()
            hidden = self.hidden(segment.cache, stream.codes(window.start, window.end), window.start - segment.start)
            segment.hidden = hidden if segment.hidden is None else torch.cat([segment.hidden, hidden])
            inputs.append(segment.hidden[window.conv_start - segment.hidden_start :])
            drop = max(0, segment.hidden.shape[0] - keep)
            segment.hidden = segment.hidden[drop:]
            segment.hidden_start += drop
            if window.end == segment.end:  # its last window: the segment is spent
                segment.cache = segment.hidden = None
        return inputs

    def _convolve(self, hidden: torch.Tensor) -> torch.Tensor:
        for blocks in self.model.upsample:
            for block in blocks:
                hidden = block(hidden)
        for block in self.model.decoder:
            hidden = block(hidden)
        return hidden.clamp(min=-1, max=1)


def final_samples(windows: Sequence[Window], waves: Sequence[torch.Tensor]) -> torch.Tensor:
    """The samples ``windows`` make final, joined in order (``waves``: their convolutions' output)."""
    parts = [wave[window.emit_from : window.emit_to] for window, wave in zip(windows, waves, strict=True)]
    return torch.cat(parts) if parts else torch.zeros(0)


def decode_whole(runner: Code2WavRunner, chunking: Chunking, codes: torch.Tensor) -> torch.Tensor:
    """``codes`` ``Long[Q, T]`` through the streaming path at once: the float samples the stream emits."""
    stream = CodeStream(chunking, runner.geometry, runner.num_quantizers)
    if codes.shape[-1]:
        stream.add(codes)
    stream.finish(int(codes.shape[-1]))
    windows = stream.take_windows(1 << 62)
    return final_samples(windows, runner.waveforms(runner.transform(stream, windows)) if windows else [])


def to_pcm16(samples: torch.Tensor) -> np.ndarray:
    """Float samples (any float dtype, any device) → int16 as a player expects: clipped to [-1, 1],
    × 32767, rounded to nearest."""
    wide = samples.detach().to("cpu", torch.float64).clamp(-1, 1).numpy()
    return np.rint(wide * 32767.0).astype(np.int16)


__all__ = ["Code2WavRunner", "decode_whole", "final_samples", "geometry", "plan_groups", "to_pcm16"]
