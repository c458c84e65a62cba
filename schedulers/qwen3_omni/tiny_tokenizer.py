"""A small Qwen-style tokenizer and Qwen3-Omni's chat template, for the tiny random checkpoints (:mod:`.tiny`).

:func:`build_tokenizer` is :func:`schedulers.tiny_omni.build_tokenizer` on a fixed English corpus with the
special tokens Qwen3-Omni's processor and generate read (``<|im_start|>``, ``<|audio_pad|>``, ``<tts_pad>``,
...).  :data:`CHAT_TEMPLATE` renders audio as ``<|audio_start|><|audio_pad|><|audio_end|>``, images as
``<|vision_start|><|image_pad|><|vision_end|>``, videos as ``<|vision_start|><|video_pad|><|vision_end|>``.
"""

from __future__ import annotations

from typing import Any

from schedulers.tiny_omni import ROLES, Media, TokenizerSpec
from schedulers.tiny_omni import token_id as token_id

SPECIAL_TOKENS = (
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio_pad|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
)

SPEC = TokenizerSpec(
    SPECIAL_TOKENS,
    audio=Media("<|audio_start|>", "<|audio_pad|>", "<|audio_end|>"),
    image=Media("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"),
    video_pad="<|video_pad|>",
    image_first=True,
)

# The attributes Qwen3OmniMoeProcessor reads from its tokenizer.
NAMED_TOKENS = SPEC.named_tokens

ROLE_WORDS = ROLES

_CORPUS = (
    "You are a helpful assistant. The user asks a question and the assistant answers it.",
    "What is said in this audio? Describe the image. What color is the picture? Listen to the clip.",
    "Hello, how are you today? I am fine, thank you. The weather is nice and the sky is blue.",
    "One, two, three, four, five, six, seven, eight, nine, ten. Numbers 0123456789 and symbols !?.,;:'\"-",
    "The quick brown fox jumps over the lazy dog. A tone, a voice, a song, a word, a sound, silence.",
    "Please answer in a short sentence. Tell me a story about a cat, a dog and a bird in the garden.",
)

CHAT_TEMPLATE = SPEC.chat_template


def build_tokenizer(vocab_size: int = 384) -> Any:
    """A ``Qwen2Tokenizer`` of about ``vocab_size`` ids: byte-level BPE + :data:`SPECIAL_TOKENS` after it."""
    corpus = [*_CORPUS, *(" ".join(ROLE_WORDS) for _ in range(50)), *("\n".join(ROLE_WORDS) for _ in range(50))]
    return SPEC.build(corpus, vocab_size)
