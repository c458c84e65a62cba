"""The AR thinker as the responder of the speech pipeline's voice loop (``configs/realtime-llm.toml``).

The speech pipeline (``configs/speech.toml``, :mod:`schedulers.speech.pipeline`) hands its
``responder`` stage either a realtime turn's transcript (``{"text": ...}`` from ASR) or the raw
chat inputs, and expects ``payload.data["text"]`` to be the answer that TTS speaks.
:func:`create_thinker_responder` serves that contract with the same continuous-batching
:class:`~schedulers.ar.scheduler.ARScheduler` the omni pipeline's thinker uses: the turn becomes a
``user: …\\nassistant:`` prompt, the answer is generated whole (the responder is not a stream
source in that graph) and its ``text`` (plus ``output_token_ids``, ``finish_reason``) is the result.
Concurrent turns share decode steps.
"""

from __future__ import annotations

import functools
from typing import Any

from omnitrio.contract import StagePayload
from schedulers.ar.scheduler import ARScheduler
from schedulers.omni.inputs import parse_chat
from schedulers.omni.stages import create_thinker_stage


def responder_prompt(payload: StagePayload) -> str:
    """The prompt of a turn: the transcript (``{"text"}``), a prompt string, or the chat's messages."""
    data = payload.data
    if isinstance(data, dict) and "raw_inputs" in data:
        data = data["raw_inputs"]
    match data:
        case {"task": "chat"}:
            return parse_chat(data).prompt
        case {"text": str(text)} | str(text):
            return f"user: {text.strip()}\nassistant:"
    kind = f"a dict with keys {sorted(data)}" if isinstance(data, dict) else type(data).__name__
    raise ValueError(f"responder needs a transcript {{'text': ...}}, chat inputs or a string, got {kind}")


@functools.wraps(create_thinker_stage, assigned=())  # its signature is the thinker's: config checks the arguments
def create_thinker_responder(**thinker_args: Any) -> ARScheduler:
    """The thinker answering turns; it takes :func:`~schedulers.omni.stages.create_thinker_stage`'s
    arguments.  The answer is generated whole: in the speech graph it streams to nobody
    (``params["stream"]`` is for TTS)."""
    thinker = create_thinker_stage(**thinker_args)
    tokenizer, knobs = thinker.tokenizer, thinker.prepare
    assert tokenizer is not None and knobs is not None  # create_thinker_stage gives both

    def prepare(payload: StagePayload) -> StagePayload:
        inputs: Any = payload.request.inputs
        data: dict[str, Any] = {"prompt_token_ids": tokenizer.encode(responder_prompt(payload))}
        if isinstance(inputs, dict) and inputs.get("task") == "chat" and inputs.get("max_tokens"):
            data["max_new_tokens"] = inputs["max_tokens"]
        payload.data = data
        return knobs(payload)

    thinker.prepare = prepare
    thinker.stream = False
    return thinker
