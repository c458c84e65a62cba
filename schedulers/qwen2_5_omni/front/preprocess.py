"""The preprocess stage: a chat request → the checkpoint processor's tensors, the encoders to run, the knobs.

The request is read by :mod:`schedulers.front.chat` (its parts, media and numbers; any malformed input, a
video part included, is a ``ValueError`` naming the field, which the stage answers as a 400).  Audio at
16 kHz reaches the feature extractor as it came (PCM16 / 32768, never resampled: the answer changes
otherwise); other rates are resampled to 16 kHz.  The stage's output is a
:class:`~schedulers.front.handoffs.Preprocessed` (:mod:`schedulers.qwen2_5_omni.graph` says what
each branch receives of it).

**The system prompt.**  Qwen2.5-Omni speaks only under the system prompt it was trained with
(:data:`SYSTEM_PROMPT`, the one the release's model card uses and older transformers warned about when it
was missing); its chat template would otherwise add "You are a helpful assistant.".  Neither the checkpoint
nor transformers 5.23 holds that prompt, so it is a constant here (the factory's ``system_prompt`` replaces
it).  A request whose first message is not a system message gets it as its first message; a request that
brings its own system message keeps it.

``audio.voice`` picks the speaker (:meth:`Preprocessor.speaker`): a speaker of the checkpoint's
``spk_dict.pt`` in any case, or one of OpenAI's voice names for the default speaker (``Chelsie``,
``generate``'s default, when the checkpoint has it); any other name is a 400 listing the speakers.

``stream`` (the chat request's own flag; absent: True) says whether the answer's audio may be decoded in
chunks as it comes; ``stream: false`` asks for the whole decode, equal to ``generate``'s audio.

``device`` is where the feature extractor computes the audio's log-mel spectrogram; the stage has no
weights, so no ``dtype``: what it hands on is on the CPU, features and pixels in float32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from schedulers.checkpoints import checked_by
from schedulers.devices import Placement
from schedulers.front.chat import OPENAI_VOICES, chat_messages, number, spoken
from schedulers.front.handoffs import Preprocessed
from schedulers.front.stages import create_preprocess_stage as preprocess_stage
from schedulers.front.stages import preprocessed_fields
from schedulers.front.warm_up import preprocess_warm_up
from schedulers.qwen2_5_omni.checkpoint import Speakers, load_config, preflight, require_model_dir, speakers
from schedulers.qwen2_5_omni.front.processor import OmniProcessor
from schedulers.qwen2_5_omni.handoffs import Knobs
from schedulers.simple import SimpleScheduler

SYSTEM_PROMPT = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving auditory "
    "and visual inputs, as well as generating text and speech."
)
DEFAULT_SPEAKER = "Chelsie"  # generate's default speaker


def with_system_prompt(messages: list[dict[str, Any]], system_prompt: str) -> list[dict[str, Any]]:
    """``messages`` led by a system message: theirs when the first message is one, else ``system_prompt``."""
    if messages and messages[0]["role"] == "system":
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


class Preprocessor:
    """One checkpoint's processor, speakers and system prompt: :meth:`__call__` preprocesses a request."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        system_prompt: str = SYSTEM_PROMPT,
        default_speaker: str | None = None,
        device: str = "cpu",
    ) -> None:
        self.processor = OmniProcessor.from_pretrained(model_dir, device)
        self.system_prompt = system_prompt
        voiced = load_config(model_dir).enable_audio_output
        self.speakers: Speakers | None = speakers(model_dir) if voiced else None
        self.default_speaker: str | None = None
        if self.speakers:
            preferred = default_speaker or (DEFAULT_SPEAKER if DEFAULT_SPEAKER in self.speakers else None)
            self.default_speaker = self._lookup(preferred, "default_speaker") if preferred else self.speakers.names[0]

    def _lookup(self, name: str, field: str) -> str:
        assert self.speakers is not None
        try:
            return self.speakers.lookup(name).name
        except KeyError:
            listed = ", ".join(self.speakers)
            raise ValueError(f"{field}: {name!r} is not a voice of this model; use one of {listed}") from None

    def speaker(self, voice: Any) -> str:
        """The speaker ``audio.voice`` names (module docstring)."""
        if self.speakers is None or self.default_speaker is None:
            raise ValueError("modalities: this checkpoint has no talker, so it cannot answer in audio")
        if voice is None:
            return self.default_speaker
        if not isinstance(voice, str):
            raise ValueError(f"audio.voice: must be a string, got {type(voice).__name__}")
        try:
            return self.speakers.lookup(voice).name
        except KeyError:
            if voice.casefold() in OPENAI_VOICES:
                return self.default_speaker
        listed = ", ".join(self.speakers)
        raise ValueError(
            f"audio.voice: {voice!r} is not a voice of this model; use one of {listed} "
            f"(or an OpenAI voice name for {self.default_speaker})"
        )

    def __call__(self, inputs: Any) -> Preprocessed:
        """The request preprocessed; a ``ValueError`` naming the field for anything malformed."""
        messages, audio, images = chat_messages(inputs)
        want_audio, voice = spoken(inputs)
        stream = inputs.get("stream") if isinstance(inputs, dict) else None
        if stream is not None and not isinstance(stream, bool):
            raise ValueError(f"stream: must be a boolean, got {stream!r}")
        knobs = Knobs(
            max_new_tokens=number(inputs, "max_tokens", int, 1),
            temperature=number(inputs, "temperature", float, 0.0),
            seed=number(inputs, "seed", int),
            speaker=self.speaker(voice) if want_audio or voice is not None else None,
            stream=stream is not False,
            want_audio=want_audio,
        )
        text = self.processor.render(with_system_prompt(messages, self.system_prompt))
        tensors = self.processor(text, audio=audio, images=images)
        return Preprocessed(knobs=knobs, **preprocessed_fields(tensors))


@checked_by(preflight)
def create_preprocess_stage(
    *,
    model_dir: str | None = None,
    system_prompt: str = SYSTEM_PROMPT,
    default_speaker: str | None = None,
    max_concurrency: int = 1,
    device: str = "cpu",
) -> SimpleScheduler:
    """The preprocess stage (module docstring) of the checkpoint at ``model_dir``; ``system_prompt`` is
    the one a request without its own gets, ``default_speaker`` the voice of OpenAI's names."""
    placement = Placement.of("preprocess", device)
    torch.set_num_threads(1)
    preprocessor = Preprocessor(
        require_model_dir(model_dir),
        system_prompt=system_prompt,
        default_speaker=default_speaker,
        device=str(placement.device),
    )
    return preprocess_stage(preprocessor, max_concurrency=max_concurrency, warm_up=preprocess_warm_up(preprocessor))
