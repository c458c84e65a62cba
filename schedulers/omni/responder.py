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

from typing import Any

from omnitrio.contract import StagePayload
from schedulers.ar.scheduler import ARScheduler
from schedulers.omni.inputs import parse_chat
from schedulers.omni.stages import load_thinker, thinker_knobs


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


def create_thinker_responder(
    *,
    seed: int = 0,
    dim: int = 128,
    n_layers: int = 2,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    max_seq_len: int = 512,
    max_running_requests: int = 16,
    max_waiting_requests: int = 256,
    max_new_tokens: int = 24,
    ignore_eos: bool = True,
    tokenizer_vocab_size: int = 2048,
) -> ARScheduler:
    """The thinker (tiny random Llama) answering turns; arguments as in ``create_thinker_stage``."""
    tokenizer, engine = load_thinker(
        seed=seed,
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        max_seq_len=max_seq_len,
        max_running_requests=max_running_requests,
        max_waiting_requests=max_waiting_requests,
        tokenizer_vocab_size=tokenizer_vocab_size,
    )
    knobs = thinker_knobs(max_new_tokens, max_seq_len, ignore_eos)

    def prepare(payload: StagePayload) -> StagePayload:
        inputs: Any = payload.request.inputs
        data: dict[str, Any] = {"prompt_token_ids": tokenizer.encode(responder_prompt(payload))}
        if isinstance(inputs, dict) and inputs.get("task") == "chat" and inputs.get("max_tokens"):
            data["max_new_tokens"] = inputs["max_tokens"]
        payload.data = data
        return knobs(payload)

    # stream=False: in the speech graph the responder streams to nobody (params["stream"] is for TTS).
    return ARScheduler(engine, tokenizer, default_max_new_tokens=max_new_tokens, stream=False, prepare=prepare)
