"""A tiny autoregressive talker: thinker token ids → log-mel frames, streamed chunk by chunk.

:class:`TinyTalker` (random weights from a seed) emits ``frames_per_token`` frames per thinker token;
each frame is computed from the previous frame, a recurrent state and the embedding of the token it
voices — autoregressive over frames, conditioned on the thinker's tokens.  Output frames are
``log(mel magnitude)`` in the range :class:`~schedulers.ar.vocoder.GriffinLimVocoder` expects.

:class:`TalkerScheduler` is the stage: a ``new_request`` payload whose ``data`` holds
``output_token_ids`` (the AR scheduler's result) or ``token_ids`` is voiced; every ``chunk_frames``
frames go out as ``stream`` ``{"mel": np.float32 [frames, n_mels]}`` with
``metadata={"modality": "mel"}``, then a ``result`` whose payload ``data`` gets ``num_frames``.
Requests are served round robin, one chunk each per turn, so a long one does not hold back the
others; ``abort`` stops a request before its next chunk.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import attrs
import numpy as np
import torch
from torch import nn

from omnitrio.contract import IncomingMessage, OutgoingMessage, StagePayload
from schedulers.ar.step_loop import StepLoop


class TinyTalker(nn.Module):
    """A GRU cell over frames, conditioned on token embeddings; deterministic for a seed."""

    def __init__(
        self, vocab_size: int = 2048, n_mels: int = 80, dim: int = 128, frames_per_token: int = 4, seed: int = 0
    ) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.n_mels = n_mels
        self.frames_per_token = frames_per_token
        self.embed = nn.Embedding(vocab_size, dim)
        self.cell = nn.GRUCell(n_mels + dim, dim)
        self.out = nn.Linear(dim, n_mels)
        with torch.no_grad():
            for param in self.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)

    def frames(self, token_ids: list[int]) -> Iterator[torch.Tensor]:
        """Yield one ``[n_mels]`` log-mel frame at a time, ``frames_per_token`` per token."""
        if not token_ids:
            return
        if any(not 0 <= t < self.embed.num_embeddings for t in token_ids):
            raise ValueError(f"talker token ids must be in [0, {self.embed.num_embeddings})")
        with torch.inference_mode():
            state = torch.zeros(1, self.cell.hidden_size)
            frame = torch.full((1, self.n_mels), -4.0)
            conditions = self.embed(torch.tensor(token_ids))
        for condition in conditions:
            for _ in range(self.frames_per_token):
                with torch.inference_mode():  # not held across the yield
                    state = self.cell(torch.cat([frame, condition[None]], dim=1), state)
                    frame = -4.0 + 3.0 * torch.tanh(self.out(state))  # log-magnitude in [-7, -1]
                yield frame[0]


@attrs.define(eq=False)
class _Voicing:
    payload: StagePayload
    frames: Iterator[torch.Tensor]
    count: int = 0


class TalkerScheduler(StepLoop):
    """Stage scheduler around :class:`TinyTalker`; formats in the module docstring."""

    def __init__(self, talker: TinyTalker | None = None, *, chunk_frames: int = 12) -> None:
        if chunk_frames < 1:
            raise ValueError(f"TalkerScheduler: chunk_frames={chunk_frames} must be >= 1")
        super().__init__()
        self.talker = talker or TinyTalker()
        self.chunk_frames = chunk_frames
        self._active: collections.OrderedDict[str, _Voicing] = collections.OrderedDict()

    def _has_work(self) -> bool:
        return bool(self._active)

    def _step(self) -> list[OutgoingMessage]:
        """One chunk per active request, in turn."""
        outputs: list[OutgoingMessage] = []
        for rid in list(self._active):
            outputs.extend(self._next_chunk(rid))
        return outputs

    def _handle(self, message: IncomingMessage) -> None:
        rid = message.request_id
        match message.type:
            case "new_request":
                try:
                    tokens = _token_ids(message.data)
                    self._active[rid] = _Voicing(message.data, self.talker.frames(tokens))
                except ValueError as exc:
                    self._outbox.put(OutgoingMessage(rid, "error", exc))
            case "abort":
                self._active.pop(rid, None)
            case "stream_chunk" | "stream_done":
                self._active.pop(rid, None)
                self._refuse_stream(message)

    def _next_chunk(self, rid: str) -> list[OutgoingMessage]:
        voicing = self._active[rid]
        try:
            frames = [frame for _, frame in zip(range(self.chunk_frames), voicing.frames, strict=False)]
        except Exception as exc:
            del self._active[rid]
            return [OutgoingMessage(rid, "error", exc)]
        outputs = []
        if frames:
            voicing.count += len(frames)
            mel = torch.stack(frames).numpy().astype(np.float32)
            outputs.append(OutgoingMessage(rid, "stream", {"mel": mel}, metadata={"modality": "mel"}))
        if len(frames) < self.chunk_frames:
            del self._active[rid]
            payload = voicing.payload
            if isinstance(payload.data, dict):
                payload.data["num_frames"] = voicing.count
            else:
                payload.data = {"num_frames": voicing.count}
            outputs.append(OutgoingMessage(rid, "result", payload))
        return outputs


def _token_ids(payload: Any) -> list[int]:
    if not isinstance(payload, StagePayload):
        raise ValueError(f"new_request data must be a StagePayload, got {type(payload).__name__}")
    match payload.data:
        case {"output_token_ids": list() as ids} | {"token_ids": list() as ids}:
            return [int(t) for t in ids]
        case _:
            raise ValueError("talker payload data must be a dict with 'output_token_ids' or 'token_ids'")
