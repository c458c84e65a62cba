"""Preprocessing: a chat request → the checkpoint processor's tensors and what the client asked of the answer.

Inputs are what the HTTP layer hands a chat pipeline (:mod:`omnitrio.serve`): ``{"task": "chat",
"messages": [OpenAI messages], "modalities", "audio": {"voice", "format"} | None, "max_tokens",
"temperature", "seed", ...}``, or a bare prompt string (one user message).  Content parts:

* ``text``;
* ``input_audio``: base64 WAV of any rate or raw 24 kHz ``pcm16``, or Python ``{"array", "sample_rate"}``
  (:func:`schedulers.media.decode_audio`).  Audio at 16 kHz reaches the feature extractor as it
  came (PCM16 / 32768, never resampled: the answer changes otherwise); other rates are resampled to 16 kHz;
* ``image_url`` with a PNG/JPEG ``data:`` URL (never fetched), or Python ``{"type": "image", "image":
  HxWx3 array}``; images keep their size (the image processor resizes them as the checkpoint says);
* video parts are refused, as is any other malformed input: a ``ValueError`` (a 400) naming the part.

**The system prompt.**  Qwen2.5-Omni speaks only under the system prompt it was trained with
(:data:`SYSTEM_PROMPT`, the one the release's model card uses and older transformers warned about when it
was missing); its chat template would otherwise add "You are a helpful assistant.".  Neither the checkpoint
nor transformers 5.23 holds that prompt, so it is a constant here (the factory's ``system_prompt`` replaces
it).  A request whose first message is not a system message gets it as its first message; a request that
brings its own system message keeps it.

``audio.voice`` picks the speaker (:meth:`Preprocessor.speaker`): a speaker of the checkpoint's
``spk_dict.pt`` in any case, or one of OpenAI's voice names for the default speaker (``Chelsie``,
``generate``'s default, when the checkpoint has it); any other name is a 400 listing the speakers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from schedulers.media import decode_audio, read_image_url
from schedulers.qwen2_5_omni.checkpoint import Speakers, load_config, speakers
from schedulers.qwen2_5_omni.front.processor import OmniProcessor

SYSTEM_PROMPT = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving auditory "
    "and visual inputs, as well as generating text and speech."
)
DEFAULT_SPEAKER = "Chelsie"  # generate's default speaker
# OpenAI's voice names (and "default") all mean the default speaker.
OPENAI_VOICES = (
    "default", "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse",
    "marin", "cedar",
)  # fmt: skip
_VIDEO_PARTS = ("input_video", "video_url", "video")


@attrs.frozen
class Knobs:
    """What the client asked of the answer: ``max_new_tokens`` and ``temperature`` (None: the stage's
    default), ``seed`` (None: none given), ``speaker`` (a name exactly as the checkpoint spells it; None
    when the answer is not spoken) and ``want_audio``."""

    max_new_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    speaker: str | None = None
    want_audio: bool = False


@attrs.frozen(eq=False)
class Preprocessed:
    """One request, preprocessed: ``input_ids`` ``Long[P]`` with the placeholders expanded; audio
    ``input_features`` ``Float[clips, 128, T]`` and ``feature_attention_mask`` ``Int[clips, T]`` (both or
    neither); images ``pixel_values`` ``Float[patches, D]`` and ``image_grid_thw`` ``Long[images, 3]`` (both
    or neither); and the :class:`Knobs`."""

    input_ids: torch.Tensor
    knobs: Knobs
    input_features: torch.Tensor | None = None
    feature_attention_mask: torch.Tensor | None = None
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None


def chat_messages(inputs: Any) -> tuple[list[dict[str, Any]], list[np.ndarray], list[np.ndarray]]:
    """OpenAI chat inputs → (transformers chat messages, audio clips at 16 kHz, RGB uint8 images), in order."""
    if isinstance(inputs, str):
        return [{"role": "user", "content": inputs}], [], []
    if not isinstance(inputs, dict) or inputs.get("task", "chat") != "chat":
        raise ValueError(f"this pipeline serves chat requests (or a prompt string), got {type(inputs).__name__}")
    messages = inputs.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages: must be a non-empty list")
    out: list[dict[str, Any]] = []
    audio: list[np.ndarray] = []
    images: list[np.ndarray] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"{where}: must be a dict with a string 'role'")
        match message.get("content"):
            case None | str() as content:
                out.append({"role": message["role"], "content": content or ""})
            case list(content):
                parts = [_part(part, f"{where}.content[{j}]", audio, images) for j, part in enumerate(content)]
                out.append({"role": message["role"], "content": parts})
            case content:
                raise ValueError(f"{where}.content: must be a string or a list of parts, got {type(content).__name__}")
    return out, audio, images


def _part(part: Any, where: str, audio: list[np.ndarray], images: list[np.ndarray]) -> dict[str, Any]:
    match part:
        case {"type": "text", "text": str(words)}:
            return {"type": "text", "text": words}
        case {"type": "input_audio", "input_audio": dict(spec)}:
            audio.append(decode_audio(spec, f"{where}.input_audio"))
            return {"type": "audio"}
        case {"type": "image_url", "image_url": dict(spec)}:
            images.append(read_image_url(spec.get("url"), f"{where}.image_url.url"))
            return {"type": "image"}
        case {"type": "image", "image": image}:
            images.append(_rgb(image, f"{where}.image"))
            return {"type": "image"}
        case {"type": str(kind)} if kind in _VIDEO_PARTS:
            raise ValueError(f"{where}: video input is not supported by this model server (audio and images are)")
        case _:
            raise ValueError(f"{where}: unsupported part; expected text, input_audio or image_url")


def _rgb(image: Any, where: str) -> np.ndarray:
    pixels = np.asarray(image)
    if pixels.ndim != 3 or pixels.shape[2] != 3 or min(pixels.shape[:2]) < 1:
        raise ValueError(f"{where}: must be an HxWx3 RGB array, got shape {pixels.shape}")
    if pixels.dtype != np.uint8:
        pixels = np.clip(np.round(pixels.astype(np.float64) * 255.0), 0, 255).astype(np.uint8)
    return pixels


def with_system_prompt(messages: list[dict[str, Any]], system_prompt: str) -> list[dict[str, Any]]:
    """``messages`` led by a system message: theirs when the first message is one, else ``system_prompt``."""
    if messages and messages[0]["role"] == "system":
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


def _number(inputs: Any, key: str, kind: type, minimum: float | None) -> Any:
    value = inputs.get(key) if isinstance(inputs, dict) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and not isinstance(value, int)):
        raise ValueError(f"{key}: must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{key}: must be >= {minimum}, got {value!r}")
    return kind(value)


class Preprocessor:
    """One checkpoint's processor, speakers and system prompt: :meth:`__call__` preprocesses a request."""

    def __init__(
        self, model_dir: str | Path, *, system_prompt: str = SYSTEM_PROMPT, default_speaker: str | None = None
    ) -> None:
        self.processor = OmniProcessor.from_pretrained(model_dir)
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
        request = inputs if isinstance(inputs, dict) else {}
        modalities = request.get("modalities") or ["text"]
        if not isinstance(modalities, list | tuple) or not set(modalities) <= {"text", "audio"}:
            raise ValueError(f"modalities: must be a subset of ['text', 'audio'], got {modalities!r}")
        want_audio = "audio" in modalities
        spec = request.get("audio")
        voice = spec.get("voice") if isinstance(spec, dict) else None
        knobs = Knobs(
            max_new_tokens=_number(request, "max_tokens", int, 1),
            temperature=_number(request, "temperature", float, 0.0),
            seed=_number(request, "seed", int, None),
            speaker=self.speaker(voice) if want_audio or voice is not None else None,
            want_audio=want_audio,
        )
        text = self.processor.render(with_system_prompt(messages, self.system_prompt))
        tensors = self.processor(text, audio=audio, images=images)
        return Preprocessed(
            input_ids=tensors["input_ids"][0],
            knobs=knobs,
            input_features=tensors.get("input_features"),
            feature_attention_mask=tensors.get("feature_attention_mask"),
            pixel_values=tensors.get("pixel_values"),
            image_grid_thw=tensors.get("image_grid_thw"),
        )
