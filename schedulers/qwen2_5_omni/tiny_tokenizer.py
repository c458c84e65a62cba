"""The tokenizer and chat template of the tiny Qwen2.5-Omni checkpoints, built offline.

:func:`build_tokenizer` trains a small byte-level BPE (the ``tokenizers`` library, a fixed corpus: the same
tokenizer every time) and wraps it in transformers' ``Qwen2Tokenizer`` with the added tokens under the names
the released Qwen2.5-Omni tokenizer gives them (``<|AUDIO|>``, ``<|audio_bos|>``, ``<|IMAGE|>``,
``<|vision_bos|>``, ...) and the attributes ``Qwen2_5OmniProcessor`` reads (``audio_token``,
``image_token``, ...).  ``system``, ``user`` and ``assistant`` are one token each, as in Qwen's vocabulary.

The talker's text ids (``<tts_text_bos>``, ``<tts_text_eod>``, ``<tts_pad>`` in the thinker's embedding)
and the speakers' ``bos_token`` ids are not tokens of the released tokenizer: they are embedding rows past
its last token, inside the thinker's vocabulary.  :func:`reserved_ids` places them the same way.

:data:`CHAT_TEMPLATE` renders as the release's template does: a default system turn ("You are a helpful
assistant.") when the first message is not a system message, audio as ``<|audio_bos|><|AUDIO|><|audio_eos|>``,
images as ``<|vision_bos|><|IMAGE|><|vision_eos|>``, videos as ``<|vision_bos|><|VIDEO|><|vision_eos|>``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import attrs

ADDED_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
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

PROCESSOR_TOKENS = {
    "audio_token": "<|AUDIO|>",
    "image_token": "<|IMAGE|>",
    "video_token": "<|VIDEO|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
}

ROLES = ("system", "user", "assistant")
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

_TEXT = (
    "You are a helpful assistant. You are Qwen, a virtual human who hears, sees and speaks.",
    "What is said in this audio? Describe the image. What color is it? Listen to the clip and answer.",
    "Good morning, how are you? I am well, thanks. The sun is out and the sea is calm today.",
    "Zero one two three four five six seven eight nine ten. Digits 0123456789 and marks !?.,;:'\"-()",
    "A red ball, a green leaf, a blue car, a quiet room, a loud bell, a short word, a long song.",
    "Please reply briefly. Tell me about the river, the hill, the town and the people who live there.",
)

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'audio' or 'audio' in part or 'audio_url' in part -%}"
    "{{- '<|audio_bos|><|AUDIO|><|audio_eos|>' -}}"
    "{%- elif part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "{{- '<|vision_bos|><|IMAGE|><|vision_eos|>' -}}"
    "{%- elif part['type'] == 'video' or 'video' in part -%}"
    "{{- '<|vision_bos|><|VIDEO|><|vision_eos|>' -}}"
    "{%- elif 'text' in part -%}"
    "{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)


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
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(ADDED_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    roles = [" ".join(ROLES), "\n".join(ROLES)] * 40
    bpe.train_from_iterator([*_TEXT, *roles], trainer)
    state = json.loads(bpe.model.__getstate__())
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    options: dict[str, Any] = {"merges": merges, "unk_token": None}  # merge pairs, no unknown token
    tokenizer = Qwen2Tokenizer(
        vocab=dict(bpe.get_vocab()),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=PROCESSOR_TOKENS,
        **options,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(ADDED_TOKENS)})
    tokenizer.chat_template = CHAT_TEMPLATE
    for role in ROLES:
        ids = tokenizer.encode(f"<|im_start|>{role}\n", add_special_tokens=False)
        if len(ids) != 3:
            raise RuntimeError(f"build_tokenizer: {role!r} after <|im_start|> is not one token ({ids})")
    return tokenizer


def token_id(tokenizer: Any, token: str) -> int:
    """The id of ``token`` (an added token or a role word); a RuntimeError if it is not one token."""
    ids = tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        raise RuntimeError(f"{token!r} is not one token of this tokenizer ({ids})")
    return int(ids[0])
