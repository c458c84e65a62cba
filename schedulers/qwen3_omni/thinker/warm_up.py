"""What the thinker stage pays at start-up instead of its first requests: every input path, batch 1 and more.

:func:`thinker_warm_up` gives the :class:`~schedulers.warm_up.WarmUp` steps, each a set of synthetic
requests the scheduler serves to completion (:meth:`~schedulers.engine.step_loop.StepLoop.rehearse`,
the handling and steps a real request takes) on the serving thread:

* ``text``: a text prompt, spoken (the accept-layer states the talker takes), prefilled and decoded alone;
* ``audio`` / ``image``: a prompt with audio features (the audio placeholders' scatter, the audio rope
  positions) / with an image (the image scatter, the deepstack layers, the 3-D rope positions);
* ``batch``: three requests at once, an unspoken one sampled as the stage samples by default among
  them, decoded as one batch.

Each request asks for a few tokens, greedy unless said.  Afterwards the stage holds nothing of them (no request, no
key/value row; a step that leaves any raises, failing the start) and its step count is back to 0; the
outputs go nowhere.  The prompts are placeholder ids, so the checkpoint's tokenizer is not needed.
"""

from __future__ import annotations

from omnitrio.contract import IncomingMessage, OmniRequest, StagePayload
from schedulers.engine.decoder_stage import DecoderScheduler
from schedulers.front.handoffs import ThinkerInput
from schedulers.qwen3_omni.warm_up_prompts import WarmUpPrompts
from schedulers.warm_up import WarmUp


def thinker_warm_up(scheduler: DecoderScheduler) -> WarmUp:
    """The steps of the module docstring, for ``scheduler`` (its engine's model gives the ids and sizes)."""
    prompts = WarmUpPrompts(scheduler.engine.lm.config)
    warm_up = WarmUp()
    warm_up.step("text", lambda: _serve(scheduler, [prompts.text(spoken=True)]))
    warm_up.step("audio", lambda: _serve(scheduler, [prompts.audio()]))
    warm_up.step("image", lambda: _serve(scheduler, [prompts.image()]))
    batch = [prompts.text(spoken=False, sampled=True), prompts.audio(), prompts.text(spoken=True)]
    warm_up.step("batch", lambda: _serve(scheduler, batch))
    return warm_up


def _serve(scheduler: DecoderScheduler, inputs: list[ThinkerInput]) -> None:
    steps = scheduler.steps
    messages = []
    for i, given in enumerate(inputs):
        rid = f"warm-up-{i}"
        request = OmniRequest()
        messages.append(IncomingMessage(rid, "new_request", StagePayload(rid, request, given)))
    outputs = scheduler.rehearse(messages)
    failed = [out.data for out in outputs if out.type == "error"]
    if failed:
        raise failed[0]
    if scheduler.live_requests or scheduler.kv_bytes:
        raise RuntimeError(f"thinker warm-up left {scheduler.live_requests} requests, {scheduler.kv_bytes} KV bytes")
    scheduler.steps = steps
