"""One GGUF model loaded by llama.cpp: its weights, its vocabulary and metadata, and one decoding context.

:func:`load_model` loads the file (an architecture llama.cpp cannot load is a
:class:`~schedulers.llamacpp.errors.ModelFileError` naming the file) and creates one context whose
KV cache is *unified*: ``kv_tokens`` cells shared by up to ``n_seq_max`` sequences, so one sequence
may hold any share of it and a prefix copied to another sequence (``seq_cp``) shares its cells
instead of duplicating them.  ``n_threads`` serve both decode and prefill.

Not thread-safe: the thread that decodes owns the object.  :meth:`LlamaModel.close` frees the
context and the weights; the object must not be used afterwards.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any, Final

from schedulers.llamacpp.errors import ModelFileError

_init_lock: Final = threading.Lock()
_initialized: list[bool] = []


def bindings() -> Any:
    """The bindings, with the backend initialised once and llama.cpp's own log cut to errors."""
    import llama_cpp
    from llama_cpp import _logger

    with _init_lock:
        if not _initialized:
            _logger.set_verbose(False)
            llama_cpp.llama_backend_init()
            _initialized.append(True)
    return llama_cpp


class LlamaModel:
    """The loaded model and its context (see the module docstring)."""

    def __init__(self, path: Path, *, kv_tokens: int, n_seq_max: int, n_batch: int, n_threads: int) -> None:
        llama = bindings()
        self.llama = llama
        self.path = Path(path)
        params = llama.llama_model_default_params()
        params.use_mmap = True
        model = llama.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            arch = self._architecture_hint(path)
            raise ModelFileError(path, f"llama.cpp cannot load this model{arch}")
        self.model = model
        self.vocab = llama.llama_model_get_vocab(model)
        self.n_vocab: int = llama.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train: int = llama.llama_model_n_ctx_train(model)
        cparams = llama.llama_context_default_params()
        cparams.n_ctx = kv_tokens
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        cparams.n_seq_max = n_seq_max
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        cparams.kv_unified = True
        cparams.no_perf = True
        ctx = llama.llama_init_from_model(model, cparams)
        if not ctx:
            llama.llama_model_free(model)
            raise ModelFileError(path, f"llama.cpp could not create a context of {kv_tokens} tokens")
        self.ctx = ctx
        self.memory = llama.llama_get_memory(ctx)
        self.kv_tokens: int = llama.llama_n_ctx(ctx)
        self.n_seq_max: int = llama.llama_n_seq_max(ctx)
        self.n_batch = n_batch
        self._piece = ctypes.create_string_buffer(256)

    @staticmethod
    def _architecture_hint(path: Path) -> str:
        try:
            import gguf

            field = gguf.GGUFReader(str(path)).fields.get("general.architecture")
            arch = field.contents() if field is not None else None
        except Exception as exc:
            return f" (not a readable GGUF file: {type(exc).__name__}: {exc})"
        return f" (general.architecture is {arch!r})" if arch else ""

    def meta(self, key: str) -> str | None:
        """A metadata value as text, or None when the file has no such key."""
        size = 1 << 16
        while True:
            buffer = ctypes.create_string_buffer(size)
            n = self.llama.llama_model_meta_val_str(self.model, key.encode(), buffer, size)
            if n < 0:
                return None
            if n < size:
                return buffer.value.decode("utf-8", errors="replace")
            size = n + 1

    def tokenize(self, text: str) -> list[int]:
        """``text``'s tokens; control tokens written in it (``<|im_start|>``) are parsed as such, no BOS added."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        tokens = (self.llama.llama_token * capacity)()
        n = self.llama.llama_tokenize(self.vocab, data, len(data), tokens, capacity, False, True)
        if n < 0:
            capacity = -n
            tokens = (self.llama.llama_token * capacity)()
            n = self.llama.llama_tokenize(self.vocab, data, len(data), tokens, capacity, False, True)
        return list(tokens[:n])

    def piece(self, token: int) -> bytes:
        """The bytes ``token`` stands for in an answer (control tokens: none)."""
        n = self.llama.llama_token_to_piece(self.vocab, token, self._piece, len(self._piece), 0, False)
        if n < 0:
            buffer = ctypes.create_string_buffer(-n)
            n = self.llama.llama_token_to_piece(self.vocab, token, buffer, -n, 0, False)
            return buffer.raw[:n]
        return self._piece.raw[:n]

    def is_end(self, token: int) -> bool:
        """Whether ``token`` ends a turn (EOS, EOT and the model's other end-of-generation tokens)."""
        return bool(self.llama.llama_vocab_is_eog(self.vocab, token))

    def token_text(self, token: int) -> str:
        """``token``'s text in the vocabulary (control tokens included), for the chat template's names."""
        return (self.llama.llama_vocab_get_text(self.vocab, token) or b"").decode("utf-8", errors="replace")

    def set_threads(self, threads: int) -> None:
        self.llama.llama_set_n_threads(self.ctx, threads, threads)

    def close(self) -> None:
        if self.ctx:
            self.llama.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            self.llama.llama_model_free(self.model)
            self.model = None


def load_model(path: Path, *, kv_tokens: int, n_seq_max: int, n_batch: int = 512, n_threads: int = 2) -> LlamaModel:
    """Load ``path`` as it is (see :mod:`schedulers.llamacpp.weights` for the float copy)."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(path, "no such file")
    return LlamaModel(path, kv_tokens=kv_tokens, n_seq_max=n_seq_max, n_batch=n_batch, n_threads=n_threads)
