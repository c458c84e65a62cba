"""A small byte-level BPE tokenizer trained locally (no downloads), with a byte fallback.

:func:`load_tokenizer` trains a byte-level BPE on a built-in English corpus with the ``tokenizers``
package.  Byte-level means any UTF-8 text round-trips: ``decode(encode(s)) == s``.  Training takes
tens of milliseconds, so the result is cached per process; pass ``cache_dir`` to also keep it on disk
(written atomically, so concurrent processes may share a directory).  Without ``tokenizers`` the
same interface is served by :class:`ByteTokenizer` (one id per byte).

Both reserve id 0 for ``<eos>``; a caller may rely on ``eos_token_id`` and ``vocab_size``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol

EOS = "<eos>"

CORPUS = """\
The quick brown fox jumps over the lazy dog. A stage is an input and output shell around a scheduler.
Requests arrive, wait in a queue, join the running batch, and leave it when they finish or are aborted.
Every step the engine decodes one token for each running request and streams it to the caller.
The thinker reads the question and writes an answer; the talker turns the answer into speech frames;
the vocoder turns those frames into audio that a person can hear. Hello, world! How are you today?
I am fine, thank you. What time is it? It is half past ten in the morning, and the weather is nice.
She sells sea shells by the sea shore. Peter Piper picked a peck of pickled peppers.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Punctuation: , . ; : ! ? ' " ( ) [ ] { } - _ / \\ @ # $ % & *.
Once upon a time there was a little model that could only say a few words, but it said them quickly.
Streaming means the first words reach the listener before the last words have been written.
Continuous batching lets new requests start while older ones are still running, so nobody waits long.
"""


class Tokenizer(Protocol):
    """What the AR schedulers need from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_id(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """One token per UTF-8 byte (id = byte + 1); id 0 is ``<eos>``."""

    vocab_size = 257
    eos_token_id = 0

    def encode(self, text: str) -> list[int]:
        return [byte + 1 for byte in text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        return bytes(i - 1 for i in ids if 0 < i < 257).decode("utf-8", errors="replace")


class BPETokenizer:
    """A trained ``tokenizers.Tokenizer`` behind the :class:`Tokenizer` interface."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.vocab_size: int = inner.get_vocab_size()
        self.eos_token_id: int = inner.token_to_id(EOS)

    def encode(self, text: str) -> list[int]:
        return list(self._inner.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._inner.decode(ids, skip_special_tokens=True))

    def to_json(self) -> str:
        return str(self._inner.to_str())


def _train(vocab_size: int) -> Any:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    inner = HFTokenizer(models.BPE())
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    inner.train_from_iterator(CORPUS.splitlines(), trainer=trainer)
    return inner


@functools.cache
def _load_cached(vocab_size: int, cache_dir: str | None) -> Tokenizer:
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        return ByteTokenizer()
    if cache_dir is None:
        return BPETokenizer(_train(vocab_size))
    digest = hashlib.sha256(f"{vocab_size}\n{CORPUS}".encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"omnitrio-bpe-{digest}.json"
    if path.exists():
        return BPETokenizer(HFTokenizer.from_file(str(path)))
    tokenizer = BPETokenizer(_train(vocab_size))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(tokenizer.to_json())
    os.replace(tmp, path)
    return tokenizer


def load_tokenizer(vocab_size: int = 2048, cache_dir: str | None = None) -> Tokenizer:
    """The trained tokenizer (BPE, or bytes when ``tokenizers`` is missing); same object per arguments.

    ``vocab_size`` is an upper bound: the small corpus may yield fewer merges.  A model serving this
    tokenizer needs ``ModelConfig.vocab_size >= tokenizer.vocab_size``.
    """
    if vocab_size < 257:
        raise ValueError(f"load_tokenizer: vocab_size={vocab_size} must be at least 257 (bytes + <eos>)")
    return _load_cached(vocab_size, cache_dir)
