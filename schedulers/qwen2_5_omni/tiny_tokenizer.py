"""The tokenizer and chat template of the tiny Qwen2.5-Omni checkpoints, built offline.

:func:`build_tokenizer` is :func:`schedulers.tiny_omni.build_tokenizer` on a fixed corpus with the added
tokens under the names the released Qwen2.5-Omni tokenizer gives them (``<|AUDIO|>``, ``<|audio_bos|>``,
``<|IMAGE|>``, ``<|vision_bos|>``, ...) and the attributes ``Qwen2_5OmniProcessor`` reads (``audio_token``,
``image_token``, ...).

The talker's text ids (``<tts_text_bos>``, ``<tts_text_eod>``, ``<tts_pad>`` in the thinker's embedding)
and the speakers' ``bos_token`` ids are not tokens of the released tokenizer: they are embedding rows past
its last token, inside the thinker's vocabulary.  :func:`reserved_ids` places them the same way.

:data:`CHAT_TEMPLATE` renders as the release's template does: a default system turn ("You are a helpful
assistant.") when the first message is not a system message, audio as ``<|audio_bos|><|AUDIO|><|audio_eos|>``,
images as ``<|vision_bos|><|IMAGE|><|vision_eos|>``, videos as ``<|vision_bos|><|VIDEO|><|vision_eos|>``.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from schedulers.tiny_omni import ROLES, Media, TokenizerSpec
from schedulers.tiny_omni import token_id as token_id

ADDED_TOKENS = (
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|vision_pad|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
)

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

SPEC = TokenizerSpec(
    ADDED_TOKENS,
    audio=Media("<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>"),
    image=Media("<|vision_bos|>", "<|IMAGE|>", "<|vision_eos|>"),
    video_pad="<|VIDEO|>",
    default_system=DEFAULT_SYSTEM_PROMPT,
)

_TEXT = (
    "You are a helpful assistant. You are Qwen, a virtual human who hears, sees and speaks.",
    "What is said in this audio? Describe the image. What color is it? Listen to the clip and answer.",
    "Good morning, how are you? I am well, thanks. The sun is out and the sea is calm today.",
    "Zero one two three four five six seven eight nine ten. Digits 0123456789 and marks !?.,;:'\"-()",
    "A red ball, a green leaf, a blue car, a quiet room, a loud bell, a short word, a long song.",
    "Please reply briefly. Tell me about the river, the hill, the town and the people who live there.",
)

CHAT_TEMPLATE = SPEC.chat_template


@attrs.frozen
class ReservedIds:
    """Thinker embedding rows past the tokenizer's last token, and the vocabulary that holds them."""

    tts_text_pad: int
    tts_text_bos: int
    tts_text_eod: int
    speaker_bos: tuple[int, ...]
    vocab_size: int


def reserved_ids(tokenizer: Any, speakers: int) -> ReservedIds:
    """Where the talker's text ids and ``speakers`` speaker rows sit (as in the release: after the tokens)."""
    first = len(tokenizer) + 8
    speaker_bos = tuple(first + 16 + i for i in range(speakers))
    return ReservedIds(first, first + 1, first + 2, speaker_bos, 64 * math.ceil((speaker_bos[-1] + 16) / 64))


def build_tokenizer(vocab_size: int = 320) -> Any:
    """A ``Qwen2Tokenizer`` of about ``vocab_size`` tokens with the release's added tokens (module docstring)."""
    corpus = [*_TEXT, *[" ".join(ROLES), "\n".join(ROLES)] * 40]
    return SPEC.build(corpus, vocab_size)
