"""Stage factories of the omni pipeline (``configs/omni-tiny.toml``), one per stage.

Every model is tiny, random (seeded) and CPU torch with one intra-op thread, so the whole graph runs
in a few seconds on two shared cores.  Payload shapes between stages are in
:mod:`schedulers.omni.routing`; what each factory's scheduler promises:

* :func:`create_preprocess_stage`: chat inputs → ``prompt_token_ids`` (the thinker's tokenizer),
  log-mel features per audio clip, RGB arrays per image, and ``encoders`` (the branches to take);
* :func:`create_audio_encoder_stage` / :func:`create_image_encoder_stage`: features → token ids
  (``audio_token_ids`` / ``image_token_ids``), batched across requests;
* :func:`create_aggregate_stage`: passes on what ``merge_fn`` built (the thinker's prompt);
* :func:`create_thinker_stage`: the continuous-batching :class:`~schedulers.ar.scheduler.ARScheduler`
  streaming every token (``{"token_ids": [id]}``) as it is generated;
* :func:`create_detokenize_stage`: token stream → UTF-8-safe ``text`` deltas; result ``{"text",
  "finish_reason", "usage"}``;
* :func:`create_talker_stage`: the thinker's tokens → log-mel chunks (``{"mel": [frames, n_mels]}``);
* :func:`create_code2wav_stage`: mel chunks → ``audio`` chunks ``{"pcm": int16, "sample_rate": 24000}``;
  result ``{"transcript", "audio", "num_samples"}``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omnitrio.contract import StagePayload
from schedulers.ar.scheduler import ARScheduler, build_tiny_engine
from schedulers.ar.talker import TalkerScheduler, TinyTalker
from schedulers.ar.tokenizer import load_tokenizer
from schedulers.ar.vocoder import GriffinLimVocoder, GriffinLimVocoderScheduler
from schedulers.detokenize import StreamingDetokenizeScheduler
from schedulers.omni.encoders import CODE_OFFSET, LogMel, TinyAudioEncoder, TinyImageEncoder
from schedulers.omni.inputs import parse_chat
from schedulers.omni.routing import AUDIO_ENCODER, IMAGE_ENCODER
from schedulers.simple import SimpleScheduler

Batch = list[StagePayload]


def _raw_inputs(payload: StagePayload) -> Any:
    data = payload.data
    return data["raw_inputs"] if isinstance(data, dict) and "raw_inputs" in data else data


def create_preprocess_stage(
    *, tokenizer_vocab_size: int = 2048, n_mels: int = 64, image_size: int = 32, max_concurrency: int = 1
) -> SimpleScheduler:
    """Parse chat inputs (:mod:`schedulers.omni.inputs`) into features; bad inputs fail the request."""
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(tokenizer_vocab_size)
    log_mel = LogMel(n_mels)

    def preprocess(payload: StagePayload) -> StagePayload:
        turn = parse_chat(_raw_inputs(payload), image_size=image_size)
        encoders = ([AUDIO_ENCODER] if turn.audio else []) + ([IMAGE_ENCODER] if turn.images else [])
        data: dict[str, Any] = {
            "prompt_token_ids": tokenizer.encode(turn.prompt),
            "audio_features": [log_mel(clip) for clip in turn.audio],
            "image_features": list(turn.images),
            "encoders": encoders,
            "modalities": list(turn.modalities),
        }
        if turn.max_tokens is not None:
            data["max_new_tokens"] = turn.max_tokens
        if turn.temperature is not None:
            data["temperature"] = turn.temperature
        payload.data = data
        return payload

    return SimpleScheduler(preprocess, max_concurrency=max_concurrency)


def _batched(encode_items: Any, key: str, out_key: str) -> tuple[Any, Any]:
    """``compute_fn`` and ``batch_compute_fn`` that encode every item of every payload in one call."""

    def encode_batch(payloads: Batch) -> Batch:
        items = [item for p in payloads for item in p.data[key]]
        codes = iter(encode_items(items) if items else [])
        for p in payloads:
            ids = [CODE_OFFSET + c for _ in p.data[key] for c in next(codes)[1]]
            p.data = {out_key: ids, "encoders": p.data["encoders"]}
        return payloads

    def encode_one(payload: StagePayload) -> StagePayload:
        return encode_batch([payload])[0]

    return encode_one, encode_batch


def create_audio_encoder_stage(
    *,
    seed: int = 1,
    n_mels: int = 64,
    dim: int = 64,
    max_tokens: int = 32,
    max_batch_size: int = 8,
    max_batch_wait_ms: float = 0,
) -> SimpleScheduler:
    """:class:`TinyAudioEncoder`; each clip gives at most ``max_tokens`` prompt tokens.

    Batches form only from requests already waiting (``batch_wait_when_idle=False``): a lone
    request never waits for company.
    """
    torch.set_num_threads(1)
    encoder = TinyAudioEncoder.build(seed, n_mels=n_mels, dim=dim)
    one, batch = _batched(lambda clips: encoder.encode_batch(clips, max_tokens), "audio_features", "audio_token_ids")
    return SimpleScheduler(
        one,
        batch_compute_fn=batch,
        max_batch_size=max_batch_size,
        max_batch_wait_ms=max_batch_wait_ms,
        batch_wait_when_idle=False,
    )


def create_image_encoder_stage(
    *,
    seed: int = 2,
    image_size: int = 32,
    patch: int = 8,
    dim: int = 64,
    max_batch_size: int = 8,
    max_batch_wait_ms: float = 0,
) -> SimpleScheduler:
    """:class:`TinyImageEncoder`; an image gives ``(image_size / patch)^2`` prompt tokens."""
    torch.set_num_threads(1)
    encoder = TinyImageEncoder.build(seed, size=image_size, patch=patch, dim=dim)
    one, batch = _batched(encoder.encode_batch, "image_features", "image_token_ids")
    return SimpleScheduler(
        one,
        batch_compute_fn=batch,
        max_batch_size=max_batch_size,
        max_batch_wait_ms=max_batch_wait_ms,
        batch_wait_when_idle=False,
    )


def create_aggregate_stage() -> SimpleScheduler:
    """The fan-in point: ``merge_fn`` (:func:`~schedulers.omni.routing.merge_aggregate`) did the work."""
    return SimpleScheduler(lambda payload: payload)


def thinker_knobs(max_new_tokens: int, max_seq_len: int, ignore_eos: bool) -> Any:
    """``ARScheduler.prepare``: cap ``max_new_tokens``, default ``ignore_eos``, keep the prompt's tail.

    A prompt longer than the context leaves room for the answer by dropping its oldest tokens.
    """

    def prepare(payload: StagePayload) -> StagePayload:
        data = payload.data
        if not isinstance(data, dict) or "prompt_token_ids" not in data:
            raise ValueError(f"thinker input must be a dict with 'prompt_token_ids', got {type(data).__name__}")
        asked = data.get("max_new_tokens") or max_new_tokens
        data["max_new_tokens"] = new = min(int(asked), max_new_tokens)
        data.setdefault("ignore_eos", ignore_eos)
        data["prompt_token_ids"] = list(data["prompt_token_ids"])[-(max_seq_len - new) :]
        return payload

    return prepare


def create_thinker_stage(
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
    """The AR thinker (the locally trained tokenizer, a tiny random Llama on one torch thread);
    it always streams its tokens (to ``detokenize``).

    ``max_new_tokens`` caps what a request may ask (``max_tokens``) and is the default.  With
    random weights ``ignore_eos=True`` keeps answers at that length, so runs are comparable.
    These are the thinker's arguments wherever it serves (see :mod:`schedulers.omni.responder`).
    """
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(tokenizer_vocab_size)
    engine = build_tiny_engine(
        tokenizer,
        seed=seed,
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        max_seq_len=max_seq_len,
        max_running_requests=max_running_requests,
        max_waiting_requests=max_waiting_requests,
    )
    return ARScheduler(
        engine,
        tokenizer,
        default_max_new_tokens=max_new_tokens,
        stream=True,
        prepare=thinker_knobs(max_new_tokens, max_seq_len, ignore_eos),
    )


def _text_result(payload: StagePayload, text: str) -> dict[str, Any]:
    data = payload.data if isinstance(payload.data, dict) else {}
    usage = {
        "prompt_tokens": len(data.get("prompt_token_ids", ())),
        "completion_tokens": len(data.get("output_token_ids", ())),
    }
    return {"text": text, "finish_reason": data.get("finish_reason"), "usage": usage}


def create_detokenize_stage(*, tokenizer_vocab_size: int = 2048) -> StreamingDetokenizeScheduler:
    """Text deltas from the thinker's token stream.

    ``<eos>`` is not treated as the end here: the thinker already stops at it (unless told to
    ignore it) and the tokenizer decodes it to nothing, so the deltas always add up to the
    thinker's own ``text``.
    """
    tokenizer = load_tokenizer(tokenizer_vocab_size)
    return StreamingDetokenizeScheduler(tokenizer, None, build_result=_text_result, stage_name="detokenize")


def create_talker_stage(
    *,
    seed: int = 3,
    dim: int = 128,
    n_mels: int = 80,
    frames_per_token: int = 4,
    chunk_frames: int = 8,
    tokenizer_vocab_size: int = 2048,
) -> TalkerScheduler:
    """:class:`TinyTalker`: ``frames_per_token`` mel frames per thinker token, ``chunk_frames`` per chunk."""
    torch.set_num_threads(1)
    vocab = load_tokenizer(tokenizer_vocab_size).vocab_size
    talker = TinyTalker(vocab_size=vocab, n_mels=n_mels, dim=dim, frames_per_token=frames_per_token, seed=seed)
    return TalkerScheduler(talker, chunk_frames=chunk_frames)


class Code2WavScheduler(GriffinLimVocoderScheduler):
    """The Griffin-Lim vocoder with a result in the serving convention.

    The result is ``{"transcript": what the audio says (the thinker's text), "audio": {"pcm": every
    sample, int16, "sample_rate"}, "num_samples"}``.
    """

    def final_result_data(self, request_id: str, payload: StagePayload, state: Any) -> dict[str, Any]:
        pcm = np.concatenate(state.pcm) if state.pcm else np.zeros(0, np.int16)
        text = payload.data.get("text", "") if isinstance(payload.data, dict) else ""
        rate = self.vocoder.sample_rate
        return {"transcript": text, "audio": {"pcm": pcm, "sample_rate": rate}, "num_samples": len(pcm)}


def create_code2wav_stage(
    *, n_mels: int = 80, n_fft: int = 1024, hop: int = 256, n_iter: int = 8, context: int = 8, lookahead: int = 2
) -> Code2WavScheduler:
    """24 kHz audio from mel chunks; ``hop`` samples per frame; ``lookahead`` frames held back per chunk."""
    torch.set_num_threads(1)
    vocoder = GriffinLimVocoder(sample_rate=24_000, n_fft=n_fft, hop=hop, n_mels=n_mels, n_iter=n_iter)
    return Code2WavScheduler(vocoder, context=context, lookahead=lookahead)
