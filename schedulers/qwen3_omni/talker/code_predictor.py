"""The code predictor, batched over requests: one talker step's first codes → whole frames.

For each row, ``generate`` (the talker's ``prepare_inputs_for_generation``) runs the code predictor on
``[talker hidden, codec_embedding(first code)]`` for ``Q - 1`` new codes (code ``k`` from
``lm_head[k - 1]``, fed back through ``codec_embedding[k - 1]``), and the talker's next input is the
sum of the frame's ``Q`` codec embeddings (the first through the talker's own table).
:meth:`CodePredictor.frames` does that for ``B`` rows in ``Q - 1`` batched forwards with a fresh cache:
every row has the same length at every step, so nothing is padded.  The keys/values live in one
:class:`~schedulers.engine.kv_batch.KVBatch` kept from call to call: a frame writes into its spare
room and allocates nothing once it has grown to the largest batch.

It runs inside the talker stage, not as a stage of its own (SGLang-Omni's way, one frame of one
request per call, the sum streamed back): the talker's next step needs the frame's embedding sum, so a
separate stage adds a stream hop each way to every frame's critical path with nothing to overlap it,
and batches only what one hop delivered.  In-stage, one call serves every request of the step; the
per-step cost at 1, 4 and 8 requests is in ``bench/results/qwen3_omni_talker.json``
(``code_predictor_ms_per_step``), next to the talker forward's share of the wall time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from schedulers.engine.kv_batch import KVBatch
from schedulers.qwen3_omni.talker.codec_sampling import sample_rows
from schedulers.qwen3_omni.talker.model import TalkerModel


class CodePredictor:
    """``talker.code_predictor`` driven for a batch of frames (module docstring)."""

    def __init__(self, model: TalkerModel, *, rows: int = 0) -> None:
        """``rows``: how many frames a call makes room for at first (it grows to the largest call)."""
        self.model = model
        self.predictor: Any = model.talker.code_predictor
        layers = self.predictor.config.num_hidden_layers
        self.kv: KVBatch[int] = KVBatch(layers, device=model.device, rows=rows, release_when_empty=False)

    def frames(
        self,
        hidden: torch.Tensor,
        first: torch.Tensor,
        greedy: Sequence[bool],
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Frames for talker hidden states ``[B, H]`` and first codes ``[B]``.

        Returns ``(codes [B, Q], next talker inputs without text [B, H])``.
        """
        predictor = self.predictor
        groups = self.model.num_code_groups
        with torch.inference_mode():
            first_embed = self.model.codec_embed(first.view(-1, 1))
            inputs = torch.cat((hidden.unsqueeze(1), first_embed), dim=1)
            self.kv.clear()
            rows = list(range(inputs.shape[0]))
            for row in rows:
                self.kv.add(row)
            codes = [first]
            embeds = [first_embed[:, 0]]
            for step in range(groups - 1):
                cache = self.kv.step(rows, tokens=inputs.shape[1]).cache
                out = predictor.model(inputs_embeds=inputs, past_key_values=cache, use_cache=True)
                logits = predictor.lm_head[step](out.last_hidden_state)[:, -1].float()
                code = sample_rows(logits, greedy, generator)
                codes.append(code)
                inputs = predictor.model.get_input_embeddings()[step](code.view(-1, 1))
                embeds.append(inputs[:, 0])
            total = torch.stack(embeds, dim=1).sum(dim=1)
        return torch.stack(codes, dim=1), total
