"""transformers' own Qwen3-Omni answer for a checkpoint directory: the reference equality tests compare to.

:func:`reference_generate` runs ``Qwen3OmniMoeForConditionalGeneration.generate`` greedy (thinker and
talker; ``talker_do_sample=False`` makes the code predictor greedy too) on chat messages and returns the
thinker's generated ids, the talker's codes (what ``generate`` hands ``code2wav.chunked_decode``) and the
waveform (float32 at 24 kHz, as ``generate`` returns it).

Messages are transformers' chat format: ``{"role", "content": str | [parts]}`` with parts
``{"type": "text", "text"}``, ``{"type": "audio", "audio": float32 samples at 16 kHz}`` and
``{"type": "image", "image": HxWx3 uint8 array}``; the media are taken in message order.

:func:`reference_processor` is ``Qwen3OmniMoeProcessor`` assembled from the directory's tokenizer, feature
extractor, image processor (the PIL one) and chat template without a video processor: its constructor
insists on the torchvision video processor class, which does not import with the pinned CPU torch, so
the instance is built without calling it (the attributes its ``__call__`` reads are set the way its
constructor sets them).  Video inputs are not supported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from schedulers.qwen3_omni.tiny_tokenizer import NAMED_TOKENS
from toys.release_processor import media, processor_without_video


@attrs.frozen
class ReferenceOutput:
    """What ``generate`` produced for one prompt."""

    prompt_ids: list[int]
    token_ids: list[int]  # generated thinker ids (the eos included when it ended on it)
    codes: torch.Tensor | None  # Long[Q, frames] handed to code2wav, or None without audio
    waveform: np.ndarray | None  # float32 [samples] at 24 kHz, or None without audio


def reference_processor(model_dir: Path) -> Any:
    """``Qwen3OmniMoeProcessor`` of ``model_dir`` without its video processor (module docstring)."""
    from transformers import Qwen3OmniMoeProcessor

    return processor_without_video(Qwen3OmniMoeProcessor, model_dir, NAMED_TOKENS)


def load_reference_model(model_dir: Path) -> Any:
    """``from_pretrained`` (float32, eval) with the transformers 5.23 talker patch applied."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from schedulers.qwen3_omni.tiny import patch_loaded_model

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    patch_loaded_model(model)
    return model.eval()


def processor_inputs(processor: Any, messages: list[dict[str, Any]]) -> Any:
    """The processor's ``BatchFeature`` (tensors) for ``messages``: template, then text + media in order."""
    audio, pictures = media(messages)
    images = [np.asarray(picture) for picture in pictures]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return processor(text=text, audio=audio or None, images=images or None, return_tensors="pt")


def reference_generate(
    model: Any,
    processor: Any,
    messages: list[dict[str, Any]],
    *,
    speaker: str = "ethan",
    return_audio: bool = True,
    max_new_tokens: int = 16,
    talker_max_new_tokens: int = 64,
) -> ReferenceOutput:
    """Greedy ``generate`` on ``messages`` (see the module docstring); ``model`` from :func:`load_reference_model`."""
    inputs = processor_inputs(processor, messages)
    eos = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    captured: dict[str, torch.Tensor] = {}
    decode = model.code2wav.chunked_decode

    def capture(codes: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        captured["codes"] = codes.detach().clone()
        return decode(codes, *args, **kwargs)

    model.code2wav.chunked_decode = capture
    try:
        with torch.inference_mode():
            result = model.generate(
                **inputs,
                speaker=speaker,
                return_audio=return_audio,
                thinker_max_new_tokens=max_new_tokens,
                thinker_eos_token_id=eos,
                thinker_do_sample=False,
                talker_do_sample=False,
                talker_max_new_tokens=talker_max_new_tokens,
                talker_min_new_tokens=2,
            )
    finally:
        del model.code2wav.chunked_decode
    prompt = inputs["input_ids"][0].tolist()
    if return_audio:
        sequences, wav = result
        codes = captured["codes"][0]
        waveform = wav.reshape(-1).float().numpy()
    else:
        sequences, codes, waveform = result, None, None
    return ReferenceOutput(prompt, sequences[0, len(prompt) :].tolist(), codes, waveform)


def thinker_margins(
    model: Any, processor: Any, messages: list[dict[str, Any]], max_new_tokens: int = 16
) -> list[float]:
    """Per greedy step of the thinker on ``messages``: the top-1 logit minus the top-2 logit."""
    inputs = processor_inputs(processor, messages)
    eos = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.inference_mode():
        out = model.thinker.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
    return [float(top[0] - top[1]) for top in (s[0].topk(2).values for s in out.scores)]


def talker_margins(
    model: Any, processor: Any, messages: list[dict[str, Any]], *, speaker: str = "ethan", frames: int = 16
) -> dict[str, list[float]]:
    """Top-1 minus top-2 score per greedy step of the talker and of the code predictor during a
    :func:`reference_generate` (scores as ``generate`` ranks them: after its repetition penalty and
    suppressed ids): ``{"talker": [...], "code_predictor": [...]}``."""
    margins: dict[str, list[float]] = {"talker": [], "code_predictor": []}

    def scored(owner: Any, key: str) -> Any:
        generate = owner.generate

        def run(*args: Any, **kwargs: Any) -> Any:
            result = generate(*args, **{**kwargs, "output_scores": True})
            margins[key].extend(float(top[0] - top[1]) for top in (s[0].topk(2).values for s in result.scores))
            return result

        return run

    model.talker.generate = scored(model.talker, "talker")
    model.talker.code_predictor.generate = scored(model.talker.code_predictor, "code_predictor")
    try:
        reference_generate(model, processor, messages, speaker=speaker, max_new_tokens=8, talker_max_new_tokens=frames)
    finally:
        del model.talker.generate, model.talker.code_predictor.generate
    return margins


def sample_clip(kind: str, seconds: float = 1.0) -> np.ndarray:
    """A 16 kHz float32 clip: ``"silence"``, or ``"tone"`` (a gliding tone with a syllable-like envelope)."""
    t = np.arange(int(16_000 * seconds)) / 16_000
    if kind == "silence":
        return np.zeros(len(t), dtype=np.float32)
    if kind != "tone":
        raise ValueError(f"sample_clip: unknown kind {kind!r}")
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t)
    return (0.4 * envelope * np.sin(2 * np.pi * (300 + 200 * t) * t)).astype(np.float32)


def sample_image(height: int = 40, width: int = 50) -> np.ndarray:
    """A deterministic RGB uint8 image ``[height, width, 3]``: colour gradients."""
    y, x = np.mgrid[0:height, 0:width]
    image = np.stack([255 * x / max(1, width - 1), 255 * y / max(1, height - 1), 128 + 0 * x], axis=-1)
    return image.astype(np.uint8)


def sample_messages() -> dict[str, list[dict[str, Any]]]:
    """The prompts the tests use: text only, silence, a tone, and an image (each with a question)."""
    return {
        "text": [{"role": "user", "content": [{"type": "text", "text": "Hello, how are you?"}]}],
        "silence": [
            {
                "role": "user",
                "content": [
                    {"type": "audio", "audio": sample_clip("silence")},
                    {"type": "text", "text": "What is said?"},
                ],
            }
        ],
        "tone": [
            {
                "role": "user",
                "content": [{"type": "audio", "audio": sample_clip("tone")}, {"type": "text", "text": "What is said?"}],
            }
        ],
        "image": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": sample_image()},
                    {"type": "text", "text": "Describe the image."},
                ],
            }
        ],
    }


def wav_base64(samples: np.ndarray, rate: int = 16_000) -> str:
    """Float samples in [-1, 1) as a base64 16-bit mono WAV (an OpenAI ``input_audio`` part's data).

    Samples already on the 16-bit grid (``np.round(x * 32768) / 32768``) decode back exactly.
    """
    import base64
    import io
    import wave

    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(np.clip(np.round(samples * 32768), -32768, 32767).astype("<i2").tobytes())
    return base64.b64encode(out.getvalue()).decode()


def png_data_url(image: np.ndarray) -> str:
    """An RGB uint8 image as a PNG ``data:`` URL (an OpenAI ``image_url`` part's url); lossless."""
    import base64
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(image).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
