"""A small Qwen-style tokenizer and Qwen3-Omni's chat template, for the tiny random checkpoints (:mod:`.tiny`).

:func:`build_tokenizer` trains a byte-level BPE (the ``tokenizers`` library) on a fixed English corpus and
wraps it in transformers' ``Qwen2Tokenizer`` (Qwen's pre-tokenizer and byte-level decoder) with the special
tokens Qwen3-Omni's processor and generate read (``<|im_start|>``, ``<|audio_pad|>``, ``<tts_pad>``, ...).
``user``, ``assistant`` and ``system`` are single tokens, as in Qwen's vocabulary: the talker finds the
user and assistant turns by the token after ``<|im_start|>``.  Same corpus, same tokenizer: training is
deterministic.

:data:`CHAT_TEMPLATE` renders messages the way the released checkpoint's template does for text, audio and
image parts: ``<|im_start|>{role}\\n``, each part in order (audio as ``<|audio_start|><|audio_pad|>
<|audio_end|>``, images as ``<|vision_start|><|image_pad|><|vision_end|>``, videos as ``<|vision_start|>
<|video_pad|><|vision_end|>``), ``<|im_end|>\\n``, and ``<|im_start|>assistant\\n`` as the generation prompt.
"""

from __future__ import annotations

from typing import Any

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
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

# The attributes Qwen3OmniMoeProcessor reads from its tokenizer.
NAMED_TOKENS = {
    "image_token": "<|image_pad|>",
    "audio_token": "<|audio_pad|>",
    "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}

ROLE_WORDS = ("system", "user", "assistant")

_CORPUS = (
    "You are a helpful assistant. The user asks a question and the assistant answers it.",
    "What is said in this audio? Describe the image. What color is the picture? Listen to the clip.",
    "Hello, how are you today? I am fine, thank you. The weather is nice and the sky is blue.",
    "One, two, three, four, five, six, seven, eight, nine, ten. Numbers 0123456789 and symbols !?.,;:'\"-",
    "The quick brown fox jumps over the lazy dog. A tone, a voice, a song, a word, a sound, silence.",
    "Please answer in a short sentence. Tell me a story about a cat, a dog and a bird in the garden.",
)

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for content in message['content'] -%}"
    "{%- if content['type'] == 'audio' or 'audio' in content or 'audio_url' in content -%}"
    "{{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}"
    "{%- elif content['type'] == 'image' or 'image' in content or 'image_url' in content -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif content['type'] == 'video' or 'video' in content -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif content['type'] == 'text' -%}"
    "{{- content['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)


def build_tokenizer(vocab_size: int = 384) -> Any:
    """A ``Qwen2Tokenizer`` of about ``vocab_size`` ids: byte-level BPE + :data:`SPECIAL_TOKENS` after it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [*_CORPUS, *(" ".join(ROLE_WORDS) for _ in range(50)), *("\n".join(ROLE_WORDS) for _ in range(50))]
    bpe.train_from_iterator(corpus, trainer)
    state = bpe.model.__getstate__()
    import json

    model = json.loads(state) if isinstance(state, str | bytes) else state
    vocab = dict(bpe.get_vocab())
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tokenizer = Qwen2Tokenizer(  # transformers' hints: merges as strings only, unk_token never None
        vocab=vocab,
        merges=merges,  # type: ignore[arg-type]
        unk_token=None,  # type: ignore[arg-type]
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=NAMED_TOKENS,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    tokenizer.chat_template = CHAT_TEMPLATE
    for word in ROLE_WORDS:
        ids = tokenizer.encode(f"<|im_start|>{word}\n", add_special_tokens=False)
        if len(ids) != 3:
            raise RuntimeError(f"build_tokenizer: {word!r} after <|im_start|> is not one token: {ids}")
    return tokenizer


def token_id(tokenizer: Any, token: str) -> int:
    """The id of one token (a special token or a role word), or a RuntimeError naming it."""
    ids = tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        raise RuntimeError(f"token {token!r} is not a single token of this tokenizer: {ids}")
    return int(ids[0])
