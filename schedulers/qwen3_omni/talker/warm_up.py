"""What the talker stage pays at start-up instead of its first requests: each prompt kind, batch 1 and more.

:func:`talker_warm_up` gives the :class:`~schedulers.warm_up.WarmUp` steps, each a set of synthetic
requests the scheduler serves to completion (:meth:`~schedulers.engine.step_loop.StepLoop.rehearse`:
the thinker's stream, its end and its result, handled and stepped as a real request's are) on the
serving thread:

* ``text`` / ``audio`` / ``image``: a spoken answer to a prompt with nothing, an audio clip, an image
  in its user turn (the text and hidden projections, the talker's rope positions), alone: its prefill,
  decode steps, codec sampling and code predictor;
* ``batch``: three at once, one of them greedy (the greedy code predictor), decoded as one batch.

Each speaks a few frames with the stage's sampling.  Afterwards the stage holds nothing of them (no
request, no key/value row; a step that leaves any raises, failing the start), its batch sizes and random
generator are as they were, and the codes went nowhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from omnitrio.contract import IncomingMessage, OmniRequest, StagePayload, StreamItem
from schedulers.engine.handoffs import ThinkerResult
from schedulers.front.handoffs import ThinkerInput
from schedulers.qwen3_omni.handoffs import TalkerPrompt, TalkerToken
from schedulers.qwen3_omni.warm_up_prompts import TOKENS, WarmUpPrompts
from schedulers.warm_up import WarmUp

if TYPE_CHECKING:
    from schedulers.qwen3_omni.talker.stage import TalkerScheduler

FRAMES = 3
"""Codec frames each warm-up request speaks at most."""


def talker_warm_up(scheduler: TalkerScheduler) -> WarmUp:
    """The steps of the module docstring, for ``scheduler`` (its model's config gives the ids and sizes)."""
    prompts = WarmUpPrompts(scheduler.model.config)
    warm_up = WarmUp()
    warm_up.step("text", lambda: _serve(scheduler, [(prompts.text(spoken=True), False)]))
    warm_up.step("audio", lambda: _serve(scheduler, [(prompts.audio(), False)]))
    warm_up.step("image", lambda: _serve(scheduler, [(prompts.image(), False)]))
    batch = [(prompts.text(spoken=True), False), (prompts.audio(), True), (prompts.text(spoken=True), False)]
    warm_up.step("batch", lambda: _serve(scheduler, batch))
    return warm_up


def _serve(scheduler: TalkerScheduler, inputs: list[tuple[ThinkerInput, bool]]) -> None:
    sizes, state = list(scheduler.batch_sizes), scheduler._generator.get_state()
    messages = []
    for i, (given, greedy) in enumerate(inputs):
        messages.extend(_thinker_stream(f"warm-up-{i}", given, greedy, scheduler.model.config))
    outputs = scheduler.rehearse(messages)
    failed = [out.data for out in outputs if out.type == "error"]
    if failed:
        raise failed[0]
    if scheduler.active_requests or len(scheduler.kv):
        raise RuntimeError(f"talker warm-up left {scheduler.active_requests} requests, {len(scheduler.kv)} rows")
    scheduler.batch_sizes[:] = sizes
    scheduler._generator.set_state(state)


def _thinker_stream(rid: str, given: ThinkerInput, greedy: bool, config: Any) -> list[IncomingMessage]:
    """What the thinker sends the talker for ``given`` answered with :data:`TOKENS` placeholder tokens."""
    hidden = int(config.thinker_config.text_config.hidden_size)
    prompt_len = int(given.input_ids.numel())
    talker = {"max_new_tokens": FRAMES, **({"do_sample": False} if greedy else {})}
    states = torch.zeros(prompt_len, hidden)
    prompt = TalkerPrompt(
        given.input_ids, states, states, talker=talker,
        image_grid_thw=given.image_grid_thw, audio_feature_lengths=given.audio_feature_lengths,
    )  # fmt: skip
    tokens = [TalkerToken(11, torch.zeros(1, hidden)) for _ in range(TOKENS)]
    chunks = [StreamItem(i, chunk, "thinker") for i, chunk in enumerate([prompt, *tokens])]
    result = ThinkerResult(tuple(token.token_id for token in tokens), prompt_len, "length", want_audio=True)
    return [
        *(IncomingMessage(rid, "stream_chunk", chunk) for chunk in chunks),
        IncomingMessage(rid, "stream_done"),
        IncomingMessage(rid, "new_request", StagePayload(rid, OmniRequest(), result)),
    ]
