"""Streaming transcription as :class:`~schedulers.session.SessionScheduler` hooks.

A session accumulates audio.  Every ``partial_every_ms`` of new audio it re-decodes all
audio so far and emits, as ``text`` stream chunks, the words that two consecutive
hypotheses agree on (local agreement), so emitted text is rarely revised: concatenating the
deltas gives the committed prefix of the transcript.  ``close`` decodes once more and
returns ``{"text": final transcript, "audio_ms": ...}``; the final text is authoritative
(it may differ from the deltas in the last words).

Session ``config`` (the open command's ``config``):

* ``sample_rate``: rate of appended audio (default 16000; 24000 for realtime PCM16);
* ``turn_detection``: ``None`` or ``{"type": "server_vad", "threshold", "prefix_padding_ms",
  "silence_duration_ms"}``: VAD events are emitted as ``vad`` stream chunks
  ``{"type": "speech_started", "audio_start_ms": ...}`` / ``{"type": "speech_stopped", "audio_end_ms": ...}``;
  with ``pause_ms`` in it (an omnitrio extension) also ``{"type": "speech_paused" | "speech_resumed",
  "audio_ms": ...}`` (see :class:`~schedulers.speech.vad.VoiceActivityDetector`);
  or ``{"type": "semantic_vad", "eagerness": "low" | "medium" | "high" | "auto", "pause_ms"}``: the
  same events, but a turn silent ``EARLY_MS`` (100; or, when appends come in big pieces, its
  pause) is transcribed (``quick``; the audio since its last such silence, with at least ``CONTEXT_MS``
  before it, joined to the words known: a pause costs the same in a long turn) and ``speech_paused`` says
  so at once with that ``transcript``
  and the words' objection ``unfinished`` (None when they have none), so a server can start
  preparing its answer while the silence goes on (speech coming back first: ``speech_resumed``);
  at the pause of ``pause_ms`` (default ``JUDGE_AT_MS``, 200) the turn is judged on those words
  and its audio (:mod:`schedulers.speech.turn_end`; the turn model scores the audio to
  ``SCORE_AT_MS`` (100) of silence on another thread, so a turn that sounds complete there is
  judged at the pause without waiting; one that does not is scored again on the audio to the
  pause; the model's answer is used only when the words do not object).  ``EARLY_MS`` counts from
  the last voiced sample; the judgement's silences from the VAD scorer's edge, as tuned:
  ``{"type": "turn_judged", "audio_ms", "transcript", "turn_complete", "probability" (the
  model's, None when the words vetoed), "unfinished", "decision_ms": {"asr", "model", "total"}}``,
  and ``speech_stopped`` comes after the silence that judgement asks for (at once when that
  silence has passed already);
* ``language``: passed to the recognizer;
* ``partial_every_ms``: overrides the stage's partial interval for this session; ``None``
  turns partials off (VAD events and the final text still come).

A partial decode is skipped while more appends of the session are queued (the session
catches up instead of falling behind real time).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import attrs
import numpy as np

from omnitrio.contract import OmniRequest, StagePayload
from schedulers.session import SESSION_METADATA_KEY, SessionContext, SessionRef
from schedulers.speech.asr import SpeechRecognizer
from schedulers.speech.audio import ASR_SAMPLE_RATE, FloatAudio, StreamResampler, as_float_audio
from schedulers.speech.turn_end import JUDGE_AT_MS, SCORE_AT_MS, SemanticTurnDetector
from schedulers.speech.turn_words import unfinished_because
from schedulers.speech.vad import VadBackendName, VadEvent, VoiceActivityDetector
from schedulers.warm_up import WarmUp

_WORD = re.compile(r"[^\w']+")
EARLY_MS = 100  # semantic_vad: a turn whose voice is silent this long is transcribed and announced ahead of the pause
EARLY_SAMPLES = EARLY_MS * ASR_SAMPLE_RATE // 1000
SCORE_SAMPLES = SCORE_AT_MS * ASR_SAMPLE_RATE // 1000
CONTEXT_MS = 1500  # semantic_vad: at least this much known audio is decoded with a turn's new part
CONTEXT_SAMPLES = CONTEXT_MS * ASR_SAMPLE_RATE // 1000
SLACK_WORDS = 2


def _heard(audio_ms: int, transcript: str) -> dict[str, Any]:
    """``speech_paused`` with the turn's words and their objection (None: the words have none)."""
    return {
        "type": "speech_paused",
        "audio_ms": audio_ms,
        "transcript": transcript,
        "unfinished": unfinished_because(transcript),
    }


def _norm(word: str) -> str:
    return _WORD.sub("", word.lower())


def merged_words(known: str, heard: str) -> str | None:
    """``known`` followed by ``heard``, a decode that began inside the audio of ``known``'s last words:
    the longest run of ``known``'s last words (at least two, or all of a shorter ``known``) found in
    ``heard`` within its first ``SLACK_WORDS`` words (a word cut at the decode's start is misheard)
    is where they join; ``heard``'s spelling is kept from there. None when no such run is found."""
    old, new = known.split(), heard.split()
    old_norm, new_norm = [_norm(w) for w in old], [_norm(w) for w in new]
    for size in range(min(len(old), len(new)), min(2, len(old)) - 1, -1):
        if size == 0:
            break
        for skip in range(min(SLACK_WORDS, len(new) - size) + 1):
            if old_norm[len(old) - size :] == new_norm[skip : skip + size]:
                return " ".join(old[: len(old) - size] + new[skip:])
    return None


@attrs.frozen
class Heard:
    """A turn's words and the turn model's probability for its audio, found side by side: the
    seconds of the decode, of the model, and of both (the longer, on two threads)."""

    transcript: str
    probability: float
    asr_seconds: float
    model_seconds: float
    seconds: float

    def spent_ms(self) -> dict[str, float]:
        spent = {"asr": self.asr_seconds, "model": self.model_seconds, "total": self.seconds}
        return {part: round(1000 * seconds, 1) for part, seconds in spent.items()}


@attrs.define(eq=False)
class EarlyTranscript:
    """A semantic turn's words, heard at ``EARLY_MS`` of silence, and the turn model's probability
    for its audio to ``SCORE_AT_MS`` of silence (scored on another thread from then): whose
    ``key`` is (turn start, last speech sample)."""

    key: tuple[int, int]
    transcript: str
    asr_seconds: float
    scoring: Future[tuple[float, float]] | None = None  # (probability, seconds) once submitted

    def heard(self) -> Heard:
        """The words and the model's probability (waiting for the scoring, which must be submitted)."""
        assert self.scoring is not None
        probability, model_seconds = self.scoring.result()
        return Heard(
            self.transcript, probability, self.asr_seconds, model_seconds, max(self.asr_seconds, model_seconds)
        )


def _timed(score: Callable[[Any], float], audio: FloatAudio) -> tuple[float, float]:
    began = time.perf_counter()
    return score(audio), time.perf_counter() - began


@attrs.frozen
class TurnWords:
    """What the turn starting at ``turn_start`` said, as transcribed at its pauses (``ends``: the
    samples each transcript reached, all in silence; the last is where ``text`` ends)."""

    turn_start: int
    ends: tuple[int, ...]
    text: str

    @property
    def end(self) -> int:
        return self.ends[-1]

    def context_start(self) -> int:
        """The latest pause at least ``CONTEXT_MS`` before :attr:`end` (or the turn's start): a decode
        from there begins in silence and repeats enough known words to join them."""
        return max((end for end in self.ends if end <= self.end - CONTEXT_SAMPLES), default=self.turn_start)


@attrs.define(eq=False)
class TranscriptionSession:
    """Audio and hypotheses of one session; owned by the session's command chain."""

    ref: SessionRef
    resampler: StreamResampler
    language: str | None
    partial_every: int | None
    vad: VoiceActivityDetector | None = None
    detector: SemanticTurnDetector | None = None  # semantic_vad: judges each pause
    early: EarlyTranscript | None = None  # semantic_vad: the turn transcribed (and announced) ahead of its pause
    words: TurnWords | None = None  # semantic_vad: the open turn's words so far, each part transcribed once
    chunks: list[FloatAudio] = attrs.field(factory=list)
    samples: int = 0
    decoded_samples: int = 0
    previous: list[str] = attrs.field(factory=list)
    committed: list[str] = attrs.field(factory=list)
    final: dict[str, Any] | None = None
    aborted: bool = False

    def audio(self) -> FloatAudio:
        if len(self.chunks) > 1:
            self.chunks = [np.concatenate(self.chunks)]
        return self.chunks[0] if self.chunks else np.zeros(0, dtype=np.float32)


def _turn_model_once(audio: FloatAudio) -> None:
    from schedulers.speech.turn_model import shared_turn_model

    try:
        model = shared_turn_model()
    except (ImportError, FileNotFoundError):
        return
    model.probability_complete(audio)


class StreamingTranscriber:
    """Session hooks: re-decode the growing audio for partials, decode once more on close."""

    def __init__(
        self, recognizer: SpeechRecognizer, *, partial_every_ms: int = 1000, vad_backend: VadBackendName = "auto"
    ) -> None:
        if not isinstance(partial_every_ms, int) or partial_every_ms <= 0:
            raise ValueError(f"partial_every_ms must be a positive integer, got {partial_every_ms!r}")
        self.recognizer = recognizer
        self.partial_every = partial_every_ms * ASR_SAMPLE_RATE // 1000
        self.vad_backend = vad_backend
        self._scoring = ThreadPoolExecutor(max_workers=2, thread_name_prefix="turn-model")  # beside the ASR

    def warm_up(self, warm_up: WarmUp) -> WarmUp:
        """``warm_up`` with what a first session would load and run: its resampler, the voice
        activity detector's model and the turn model (when installed: without it a semantic VAD
        session fails as it would have)."""
        clip = np.zeros(ASR_SAMPLE_RATE // 2, np.float32)
        audio_24k = np.zeros(12_000, np.float32)
        warm_up.step("resample", lambda: StreamResampler(24_000, ASR_SAMPLE_RATE).push(audio_24k))
        warm_up.step("voice activity", lambda: VoiceActivityDetector(backend=self.vad_backend).feed(clip))
        warm_up.step("turn model", lambda: _turn_model_once(clip), key="turn model")
        return warm_up

    def open(self, ref: SessionRef, request: OmniRequest) -> TranscriptionSession:
        config = request.metadata.get(SESSION_METADATA_KEY, {}).get("config") or {}
        rate = config.get("sample_rate", ASR_SAMPLE_RATE)
        language = config.get("language")
        resampler = StreamResampler(rate, ASR_SAMPLE_RATE)
        state = TranscriptionSession(ref, resampler, language, self._partial_every(config))
        state.vad = self._vad(config, state)
        return state

    def _partial_every(self, config: dict[str, Any]) -> int | None:
        if "partial_every_ms" not in config:
            return self.partial_every
        every = config["partial_every_ms"]
        if every is None:
            return None
        if isinstance(every, bool) or not isinstance(every, int) or every <= 0:
            raise ValueError(f"partial_every_ms must be a positive integer or null, got {every!r}")
        return every * ASR_SAMPLE_RATE // 1000

    def _vad(self, config: dict[str, Any], state: TranscriptionSession) -> VoiceActivityDetector | None:
        turn: Any = config.get("turn_detection")
        match turn:
            case None:
                return None
            case {"type": "server_vad"}:
                return VoiceActivityDetector(
                    threshold=turn.get("threshold", 0.5),
                    prefix_padding_ms=turn.get("prefix_padding_ms", 300),
                    silence_duration_ms=turn.get("silence_duration_ms", 500),
                    backend=self.vad_backend,
                    pause_ms=turn.get("pause_ms"),
                )
            case {"type": "semantic_vad"}:
                return self._semantic_vad(turn, state)
            case _:
                raise ValueError(
                    "turn_detection must be null, {'type': 'server_vad', ...} or {'type': 'semantic_vad', ...};"
                    f" got {turn!r}"
                )

    def _semantic_vad(self, turn: dict[str, Any], state: TranscriptionSession) -> VoiceActivityDetector:
        state.detector = SemanticTurnDetector(turn.get("eagerness", "auto"))
        return VoiceActivityDetector(
            silence_duration_ms=state.detector.policy.incomplete_silence_ms,
            backend=self.vad_backend,
            pause_ms=turn.get("pause_ms", JUDGE_AT_MS),
            refine_end=False,  # the judgement's silences and turn model were tuned on the scorer's edge
        )

    def _judge(self, state: TranscriptionSession, paused: VadEvent, ctx: SessionContext) -> None:
        """Judge the turn at its pause (``turn_judged``) and tell the VAD the silence it now needs;
        first hear it and say so (``speech_paused``), unless that was done ahead of the pause (then
        only silence came since: the words are the same). A turn the early audio made sound
        complete is judged on it at once; otherwise the model hears the audio to the pause too."""
        assert state.vad is not None and state.detector is not None
        pause_ms = state.vad.pause_ms or 0
        key = (state.vad.turn_start, paused.sample - pause_ms * ASR_SAMPLE_RATE // 1000)
        early = self._early_for(state, key, ctx)
        if early is not None:
            if early.scoring is None:  # the pause came before the audio model's point
                early.scoring = self._score(state, paused.sample)
            heard = early.heard()
        else:
            heard = self._hear(state, paused.sample, ctx)
        sounded_over = early is None or heard.probability >= state.detector.policy.threshold
        probability = heard.probability if sounded_over else None  # else: score the audio to the pause
        began = time.perf_counter()
        decision = state.detector.decide(
            state.audio()[key[0] : paused.sample], heard.transcript, silence_ms=pause_ms, probability=probability
        )
        spent = heard.spent_ms()
        if probability is None:
            rescored = round(1000 * (time.perf_counter() - began), 1)
            spent = {**spent, "model": spent["model"] + rescored, "total": spent["total"] + rescored}
        state.vad.judge(decision.judgement.end_after_ms)
        judged = {
            **_heard(paused.ms, heard.transcript),
            "type": "turn_judged",
            "turn_complete": decision.judgement.complete,
            "probability": decision.judgement.probability,
            "decision_ms": spent,
        }
        ctx.emit(judged, modality="vad")

    def _hear(self, state: TranscriptionSession, end: int, ctx: SessionContext) -> Heard:
        """The open turn's words up to sample ``end``, said (``speech_paused``) as soon as they are
        decoded, and the turn model's probability for its audio to ``end``, scored on another thread
        meanwhile."""
        assert state.vad is not None and state.detector is not None
        began = time.perf_counter()
        scored = self._score(state, end)
        transcript = self._turn_words(state, end)
        asr_seconds = time.perf_counter() - began
        ctx.emit(_heard(end * 1000 // ASR_SAMPLE_RATE, transcript), modality="vad")  # the answer may start
        probability, model_seconds = scored.result()
        return Heard(transcript, probability, asr_seconds, model_seconds, time.perf_counter() - began)

    def _score(self, state: TranscriptionSession, end: int) -> Future[tuple[float, float]]:
        """The turn model scoring the open turn's audio to sample ``end``, on another thread."""
        assert state.vad is not None and state.detector is not None
        audio = state.audio()[state.vad.turn_start : end]
        return self._scoring.submit(_timed, state.detector.model.probability_complete, audio)

    def _early_for(
        self, state: TranscriptionSession, key: tuple[int, int], ctx: SessionContext
    ) -> EarlyTranscript | None:
        """The turn's early transcript when it is of ``key``; one of an earlier moment is stale
        (speech came back before the pause): ``speech_resumed`` says so, and it is dropped."""
        early = state.early
        if early is None or early.key == key:
            return early
        state.early = None
        ctx.emit({"type": "speech_resumed", "audio_ms": key[1] * 1000 // ASR_SAMPLE_RATE}, modality="vad")
        return None

    def append(
        self, state: TranscriptionSession, chunk: Any, payload: StagePayload, ctx: SessionContext
    ) -> dict[str, Any]:
        audio = state.resampler.push(as_float_audio(chunk, name="chunk"))
        self._take(state, audio, ctx)
        every = state.partial_every
        if every is not None and ctx.pending == 0 and state.samples - state.decoded_samples >= every:
            self._partial(state, ctx)
        return {"audio_ms": state.samples * 1000 // ASR_SAMPLE_RATE}

    def _take(self, state: TranscriptionSession, audio: FloatAudio, ctx: SessionContext | None) -> None:
        if audio.size == 0:
            return
        state.chunks.append(audio)
        state.samples += int(audio.size)
        if state.vad is None:
            return
        for event in state.vad.events(audio):
            if ctx is None:
                continue
            match event.type:
                case "speech_paused" if state.detector is not None:
                    self._judge(state, event, ctx)
                    continue
                case "speech_started":
                    key = "audio_start_ms"
                case "speech_stopped":
                    key = "audio_end_ms"
                case _:
                    key = "audio_ms"
            if event.type != "speech_paused":
                state.early = None  # the turn (or its pause) is over
            ctx.emit({"type": event.type, key: event.ms}, modality="vad")
        if state.detector is not None and ctx is not None:
            self._transcribe_early(state, ctx)

    def _transcribe_early(self, state: TranscriptionSession, ctx: SessionContext) -> None:
        """Ahead of the pause: once the voice has been silent ``EARLY_MS`` (counted from its last
        voiced sample), transcribe the turn and say so (``speech_paused``: a server starts its answer
        while the silence goes on); once the VAD's silence reaches ``SCORE_AT_MS``, start the turn
        model on the audio so far.  The pause's judgement reuses both."""
        assert state.vad is not None
        speech_end, silent = state.vad.silence
        key = (state.vad.turn_start, speech_end)
        heard = state.vad.voiced_silence >= EARLY_SAMPLES or silent >= SCORE_SAMPLES
        if not heard or silent >= (state.vad.pause_samples or 0):
            return
        early = self._early_for(state, key, ctx)
        scoring = early.scoring if early is not None else None
        if scoring is None and silent >= SCORE_SAMPLES:
            scoring = self._score(state, speech_end + silent)
        if early is None:
            began = time.perf_counter()
            transcript = self._turn_words(state, speech_end + silent)
            ctx.emit(_heard((speech_end + silent) * 1000 // ASR_SAMPLE_RATE, transcript), modality="vad")
            early = state.early = EarlyTranscript(key, transcript, time.perf_counter() - began)
        early.scoring = scoring

    def _turn_words(self, state: TranscriptionSession, end: int) -> str:
        """The open turn's words up to sample ``end``. The audio since the words known from its last
        pause is decoded from an earlier pause at least ``CONTEXT_MS`` before, whose words are matched
        against the known ones (:func:`merged_words`); only when they do not match is the whole turn
        decoded. So a pause costs about the same in a long turn as in a short one."""
        assert state.vad is not None
        start = state.vad.turn_start
        known = state.words
        text = None
        if known is not None and known.turn_start == start and start < known.end <= end:
            since = known.context_start()
            heard = self.recognizer.transcribe(state.audio()[since:end], state.language, quick=True)
            text = merged_words(known.text, heard) if since > start else heard
        if text is None:
            known = None
            text = self.recognizer.transcribe(state.audio()[start:end], state.language, quick=True)
        state.words = TurnWords(start, (*(known.ends if known is not None else ()), end), text)
        return text

    def _partial(self, state: TranscriptionSession, ctx: SessionContext) -> None:
        words = self.recognizer.transcribe(state.audio(), state.language).split()
        state.decoded_samples = state.samples
        agreed = 0
        for old, new in zip(state.previous, words, strict=False):
            if _norm(old) != _norm(new):
                break
            agreed += 1
        state.previous = words
        if agreed > len(state.committed):
            delta = " ".join(words[len(state.committed) : agreed])
            ctx.emit(f" {delta}" if state.committed else delta, modality="text")
            state.committed = words[:agreed]

    def abort(self, state: TranscriptionSession, ref: SessionRef) -> None:
        state.aborted = True
        state.chunks.clear()

    def close(self, state: TranscriptionSession) -> dict[str, Any] | None:
        if state.final is not None or state.aborted:
            return state.final
        self._take(state, state.resampler.flush(), None)
        text = self.recognizer.transcribe(state.audio(), state.language)
        state.final = {"text": text, "audio_ms": state.samples * 1000 // ASR_SAMPLE_RATE}
        state.chunks.clear()
        return state.final

    def usage(self, state: TranscriptionSession) -> int:
        return sum(int(chunk.nbytes) for chunk in state.chunks)
