"""The file llama.cpp loads: the user's GGUF file, or its float copy when its kernels would round activations.

llama.cpp's CPU kernels for quantized weights (Q4_x, Q8_0, the K- and IQ-quants) round each
activation vector to 8 bits before the product, which changes a small model's answers; F32, F16 and
BF16 weights keep float activations.  :func:`float_exact_file` returns the path to load:

* the file itself when every tensor is already F32/F16/BF16;
* else a copy with every quantized tensor written as F16 (llama.cpp's own ``llama_model_quantize``,
  ``ftype = F16``), made once into the cache directory and reused.  Its name is keyed by the source
  file's resolved path, size and modification time, so a replaced file gets a new copy.  The copy is
  written to a temporary name and renamed into place: a crash or a concurrent writer never leaves a
  half-written file under the final name.

The cache directory is ``$OMNITRIO_CACHE/llama-f16`` (default ``~/.cache/omnitrio/llama-f16``, or
``$XDG_CACHE_HOME/omnitrio/llama-f16``).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Final

from schedulers.llamacpp.errors import ModelFileError

FLOAT_TYPES: Final = frozenset({"F32", "F16", "BF16"})


def cache_dir() -> Path:
    """Where float copies of quantized files are kept (see the module docstring)."""
    root = os.environ.get("OMNITRIO_CACHE")
    if root:
        return Path(root) / "llama-f16"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "omnitrio" / "llama-f16"


def quantized_tensor_types(path: Path) -> set[str]:
    """The tensor types in ``path`` whose CPU kernels round activations (empty: the file is float)."""
    import gguf

    if not Path(path).is_file():
        raise ModelFileError(path, "no such file")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:
        raise ModelFileError(path, f"not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
    return {t.tensor_type.name for t in reader.tensors} - FLOAT_TYPES


def float_exact_file(path: Path, *, directory: Path | None = None, threads: int = 2) -> Path:
    """The path to load for ``path``: itself, or its cached F16 copy (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(path, "no such file")
    if not quantized_tensor_types(path):
        return path
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    directory = directory or cache_dir()
    target = directory / f"{path.stem}.{key}.f16.gguf"
    if target.is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    _write_f16(path, target, threads)
    return target


def _write_f16(source: Path, target: Path, threads: int) -> None:
    from schedulers.llamacpp.model import bindings

    llama_cpp = bindings()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_F16
    params.allow_requantize = True  # the source is quantized: dequantize it
    params.nthread = threads
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    os.close(fd)
    try:
        failed = llama_cpp.llama_model_quantize(str(source).encode(), temporary.encode(), params)
        if failed:
            raise ModelFileError(source, f"llama.cpp could not write its F16 copy (llama_model_quantize: {failed})")
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
