"""A TTS scheduler that streams audio sentence by sentence, abortable between sentences.

One scheduler thread owns every request's state; it reads the inbox and synthesizes one
sentence at a time. A request that has sent no audio yet goes first (the oldest such one: its
user is waiting to hear anything), so a new answer's first sentence never waits behind another
answer's later sentences; the others take turns (round robin).  Before each
sentence it drains the inbox, so an abort — :meth:`abort` posts it there — takes effect at
the next sentence boundary; a sentence already being synthesized when the abort comes is
discarded, so the aborted request gets no further output from the moment ``abort`` returns.

Per request, in order:

* streaming (``request.params["stream"]`` true): ``stream`` outputs
  ``{"pcm": int16 array, "sample_rate": output rate, "text": str}`` with
  ``metadata={"modality": "audio"}``, one per sentence (``text`` is that sentence, after a space
  when it is not the first; the resampler's tail comes last with ``text`` empty), so a client can
  align the transcript with the samples sentence by sentence; then a ``result`` whose ``payload.data`` is
  ``{"transcript", "sample_rate", "num_samples"}`` (and the upstream answer's ``tool_calls``, when it
  called tools);
* otherwise: a single ``result`` that also carries the whole clip as ``"pcm"``;
* bad input or a synthesis failure: one ``error`` (the exception) and nothing more.

Text may also arrive as it is written: ``stream_chunk`` items ``{"text": ...}`` from an upstream
stage (sentences, in order), before that stage's ``new_request`` payload.  Each chunk's sentences
are synthesized and streamed as soon as the scheduler gets to them, and the payload that follows
only closes the text (its ``text`` is the chunks joined); the result's ``transcript`` is the
chunks joined.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator

import attrs
import numpy as np

from omnitrio.contract import IncomingMessage, OutgoingMessage, StagePayload, StreamItem
from schedulers.speech.audio import FloatAudio, Pcm16, StreamResampler, float_to_pcm16
from schedulers.speech.requests import SpeechRequest, speech_request
from schedulers.speech.tts import SpeechSynthesizer, split_sentences, synthesize_sentences

_STOP = object()
AUDIO = {"modality": "audio"}


@attrs.define(eq=False)
class _Job:
    request_id: str
    payload: StagePayload | None  # None: streamed text whose payload has not come yet
    text: str
    stream: bool
    clips: Iterator[FloatAudio]
    resampler: StreamResampler
    sentences: deque[str]
    collected: list[Pcm16] = attrs.field(factory=list)
    num_samples: int = 0
    pending: deque[str] = attrs.field(factory=deque)  # streamed text not yet synthesized
    open: bool = False  # streamed text that may still grow (no payload yet)


class SentenceStreamingTTSScheduler:
    """Sentence-by-sentence synthesis behind the stage contract (see the module docstring)."""

    def __init__(
        self,
        synthesizer: SpeechSynthesizer,
        *,
        output_sample_rate: int = 24_000,
        parse: Callable[[StagePayload], SpeechRequest] = speech_request,
    ) -> None:
        self.synthesizer = synthesizer
        self.output_sample_rate = output_sample_rate
        self._parse = parse
        self.inbox: queue.Queue[object] = queue.Queue()
        self.outbox: queue.Queue[OutgoingMessage] = queue.Queue()
        self._jobs: deque[_Job] = deque()  # scheduler thread only
        self._aborting: set[str] = set()  # aborted by abort() but not yet removed from _jobs
        self._idle: dict[str, _Job] = {}  # streamed-text jobs waiting for more text (scheduler thread only)
        self._aborting_lock = threading.Lock()

    warmed = ("synthesize",)
    """What :meth:`warm_up_serving_thread` warms (see :mod:`schedulers.warm_up`)."""

    def warm_up_serving_thread(self) -> None:
        """Synthesize a word so the first real request does not pay onnxruntime's first-run cost."""
        self.synthesizer.synthesize("Ready.", 1.0)

    def start(self) -> None:
        while True:
            try:
                message = self.inbox.get(block=not self._jobs)
            except queue.Empty:
                self._step(self._next_job())
                continue
            if message is _STOP:
                return
            assert isinstance(message, IncomingMessage)
            self._dispatch(message)

    def stop(self) -> None:
        self.inbox.put(_STOP)

    def abort(self, request_id: str) -> None:
        with self._aborting_lock:
            self._aborting.add(request_id)
        self.inbox.put(IncomingMessage(request_id, "abort"))

    @property
    def active_requests(self) -> int:
        """Requests being synthesized (read from another thread it is a snapshot)."""
        return len(self._jobs)

    def _next_job(self) -> _Job:
        """The oldest job that has sent no audio yet, else the next in turn (taken off ``_jobs``)."""
        waiting = next((job for job in self._jobs if job.num_samples == 0), None)
        if waiting is None:
            return self._jobs.popleft()
        self._jobs.remove(waiting)
        return waiting

    def _dispatch(self, message: IncomingMessage) -> None:
        match message.type:
            case "new_request":
                self._admit(message.request_id, message.data)
            case "abort":
                self._jobs = deque(job for job in self._jobs if job.request_id != message.request_id)
                self._idle.pop(message.request_id, None)
                with self._aborting_lock:
                    self._aborting.discard(message.request_id)
            case "stream_chunk":
                self._add_text(message.request_id, message.data)
            case _:
                return

    def _streamed_job(self, request_id: str) -> _Job | None:
        job = self._idle.get(request_id)
        return job if job is not None else next((j for j in self._jobs if j.request_id == request_id and j.open), None)

    def _add_text(self, request_id: str, item: StreamItem) -> None:
        text = item.data.get("text") if isinstance(item.data, dict) else None
        if not isinstance(text, str):
            self.outbox.put(OutgoingMessage(request_id, "error", ValueError("tts stream chunks must be {'text': str}")))
            return
        job = self._streamed_job(request_id)
        if job is None:
            resampler = StreamResampler(self.synthesizer.sample_rate, self.output_sample_rate)
            job = _Job(request_id, None, "", True, iter(()), resampler, deque(), open=True)
            self._idle[request_id] = job
        job.text += text
        job.pending.append(text)
        if request_id in self._idle:
            self._wake(self._idle.pop(request_id))

    def _wake(self, job: _Job) -> None:
        job.clips = self._pending_clips(job)
        self._jobs.append(job)

    def _pending_clips(self, job: _Job) -> Iterator[FloatAudio]:
        while job.pending:
            for sentence in split_sentences(job.pending.popleft()):
                job.sentences.append(sentence)
                yield self.synthesizer.synthesize(sentence, 1.0)

    def _admit(self, request_id: str, payload: StagePayload) -> None:
        streamed = self._streamed_job(request_id)
        if streamed is not None:  # the text came as chunks; the payload closes it
            streamed.open = False
            streamed.payload = payload
            if request_id in self._idle:
                self._wake(self._idle.pop(request_id))
            return
        try:
            request = self._parse(payload)
            clips = synthesize_sentences(self.synthesizer, request.text, request.speed)
            sentences = deque(split_sentences(request.text))
            resampler = StreamResampler(self.synthesizer.sample_rate, self.output_sample_rate)
        except Exception as exc:
            self.outbox.put(OutgoingMessage(request_id, "error", data=exc))
            return
        stream = bool(payload.request.params.get("stream", False))
        if not request.text.strip():
            clips = iter(())  # nothing to say (a lenient ``parse`` allows it): an empty result, no error
        self._jobs.append(_Job(request_id, payload, request.text, stream, clips, resampler, sentences))

    def _step(self, job: _Job) -> None:
        """Synthesize the job's next sentence; requeue it, or finish it after the last one."""
        try:
            clip = next(job.clips, None)
            if clip is None and job.open:  # said all streamed text so far; more will come
                self._idle[job.request_id] = job
                return
            audio = job.resampler.push(clip) if clip is not None else job.resampler.flush()
        except Exception as exc:
            self.outbox.put(OutgoingMessage(job.request_id, "error", data=exc))
            return
        with self._aborting_lock:
            if job.request_id in self._aborting:
                return  # the inbox's abort message will forget the request
        spoken = ""
        if clip is not None and job.sentences:
            spoken = (" " if job.num_samples else "") + job.sentences.popleft()
        self._deliver(job, float_to_pcm16(audio), spoken)
        if clip is not None:
            self._jobs.append(job)
            return
        data: dict[str, object] = {
            "transcript": job.text,
            "sample_rate": self.output_sample_rate,
            "num_samples": job.num_samples,
        }
        if not job.stream:
            data["pcm"] = np.concatenate(job.collected) if job.collected else np.zeros(0, dtype=np.int16)
        answered = job.payload.data if job.payload is not None else None
        if isinstance(answered, dict) and answered.get("tool_calls"):
            data["tool_calls"] = answered["tool_calls"]  # a spoken answer that also calls tools
        result = job.payload if job.payload is not None else data
        if isinstance(result, StagePayload):
            result.data = data
        self.outbox.put(OutgoingMessage(job.request_id, "result", data=result))

    def _deliver(self, job: _Job, pcm: Pcm16, text: str) -> None:
        if pcm.size == 0:
            if text:
                job.sentences.appendleft(text.lstrip())  # said with the next audio
            return
        job.num_samples += int(pcm.size)
        if not job.stream:
            job.collected.append(pcm)
            return
        chunk = {"pcm": pcm, "sample_rate": self.output_sample_rate, "text": text}
        self.outbox.put(OutgoingMessage(job.request_id, "stream", data=chunk, metadata=dict(AUDIO)))
