"""The same Qwen3-Omni prompt for transformers and for the served pipeline (tests and bench share it).

:func:`on_pcm_grid` rounds a prompt's audio to the 16-bit grid, so the WAV an OpenAI ``input_audio`` part
carries decodes back to exactly the samples ``generate`` is given; :func:`openai_messages` turns
transformers' chat messages (:func:`toys.qwen3_omni_reference.sample_messages`) into OpenAI chat
messages (``input_audio`` WAV parts, ``image_url`` PNG data URLs); :func:`chat_inputs` is what the HTTP
layer hands a chat pipeline for them.  :func:`pcm16` converts ``generate``'s float waveform as the
code2wav stage does, and :func:`snr_db` compares two pcm16 signals.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from toys.qwen3_omni_reference import png_data_url, wav_base64


def on_pcm_grid(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with every audio part's samples rounded to multiples of 1/32768 (new dicts)."""
    out = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = [
                {**part, "audio": (np.round(np.asarray(part["audio"]) * 32768) / 32768).astype(np.float32)}
                if part["type"] == "audio"
                else part
                for part in content
            ]
        out.append({**message, "content": content})
    return out


def openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """transformers' chat messages → OpenAI's (audio as WAV ``input_audio``, images as PNG data URLs)."""

    def part(item: dict[str, Any]) -> dict[str, Any]:
        match item["type"]:
            case "audio":
                return {"type": "input_audio", "input_audio": {"data": wav_base64(item["audio"]), "format": "wav"}}
            case "image":
                return {"type": "image_url", "image_url": {"url": png_data_url(item["image"])}}
            case _:
                return {"type": "text", "text": item["text"]}

    return [
        {
            "role": m["role"],
            "content": m["content"] if isinstance(m["content"], str) else [part(p) for p in m["content"]],
        }
        for m in messages
    ]


def chat_inputs(
    messages: list[dict[str, Any]], *, audio: bool = True, voice: str = "ethan", max_tokens: int = 16
) -> dict[str, Any]:
    """The pipeline's raw chat inputs for transformers' ``messages``, greedy thinker (``temperature`` 0)."""
    return {
        "task": "chat",
        "messages": openai_messages(messages),
        "modalities": ["text", "audio"] if audio else ["text"],
        "audio": {"voice": voice, "format": "pcm16"} if audio else None,
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }


def pcm16(waveform: np.ndarray) -> np.ndarray:
    """Float samples → int16 as the code2wav stage converts them: clip to [-1, 1], × 32767, round."""
    return np.round(np.clip(np.asarray(waveform, dtype=np.float64), -1.0, 1.0) * 32767).astype(np.int16)


def snr_db(reference: np.ndarray, signal: np.ndarray) -> float:
    """Signal-to-noise ratio of ``signal`` against ``reference`` (same length) in dB; inf when equal."""
    ref = np.asarray(reference, dtype=np.float64)
    noise = float(np.sum((ref - np.asarray(signal, dtype=np.float64)) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(float(np.sum(ref**2)) / noise)
