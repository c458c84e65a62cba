"""A speech-native pipeline answers a turn: the model hears the turn's audio and speaks its answer itself.

:class:`SpeechNative` is the :class:`~.answering.Answering` of a pipeline whose model takes audio in
and gives text and audio out (Qwen3-Omni: thinker → talker → code2wav), named by the pipeline's
``realtime_answer = "speech-native"``. It needs no transcript: a response is one pipeline request,
task ``chat``, at once, whose messages are the context as the model should hear it
(:func:`speech_messages`): ``instructions`` as the system message, each user audio item as an
``input_audio`` part carrying its samples (PCM16 24 kHz as float ``{"array", "sample_rate"}``; the
pipeline's preprocessing brings them to its feature extractor's rate), text items as text, the
model's earlier answers as their text (an answer cut by the client as far as it was heard).
``modalities`` is ``["text", "audio"]`` or, for a text-only response, ``["text"]`` (the pipeline
then skips its speech stages); ``audio.voice`` is the voice name the client asked for (the pipeline
maps it to one of its speakers); ``max_tokens`` the session's limit; a numeric session
``temperature`` (a beta session field) is passed on (0: greedy). The answer streams as the pipeline
gives it: the transcript deltas of the text decode and the audio of the vocoder.
"""

from __future__ import annotations

from typing import Any

from omnitrio.serve.audio import REALTIME_RATE, pcm16_to_float
from omnitrio.serve.realtime.answering import AnswerRequest, PipelineAnswering
from omnitrio.serve.realtime.conversation import Item, messages_of
from omnitrio.serve.realtime.session_config import max_tokens


class SpeechNative(PipelineAnswering):
    """Answers through the pipeline's ``chat`` task with the turns' audio (see the module docstring)."""

    needs_transcripts = False

    def inputs(self, request: AnswerRequest) -> dict[str, Any]:
        session = request.session
        inputs: dict[str, Any] = {
            "task": "chat",
            "messages": speech_messages(request.context, session.get("instructions") or ""),
            "max_tokens": max_tokens(session),
            "modalities": ["text", "audio"] if request.audio else ["text"],
            "audio": {"voice": request.voice, "format": "pcm16"},
        }
        temperature = session.get("temperature")
        if isinstance(temperature, int | float) and not isinstance(temperature, bool):
            inputs["temperature"] = float(temperature)
        return inputs


def speech_messages(items: list[Item], instructions: str) -> list[dict[str, Any]]:
    """``items`` as chat messages for a model that hears audio, ``instructions`` first (see the module
    docstring); an item with neither audio nor text is left out."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    for item in items:
        if _is_user_audio(item):
            samples = pcm16_to_float(bytes(item.audio))
            part = {"type": "input_audio", "input_audio": {"array": samples, "sample_rate": REALTIME_RATE}}
            messages.append({"role": "user", "content": [part]})
        else:
            messages += messages_of([item], "")
    return messages


def _is_user_audio(item: Item) -> bool:
    content = item.body.get("content") or ()
    return bool(item.audio) and item.body.get("role") == "user" and any(p["type"] == "input_audio" for p in content)
