"""How a tensor rides inside a relay header, and how the receiving process rebuilds it.

The packer (:mod:`omnitrio.transport.relay`) pickles a tensor as a call to one of the
functions here, so unpickling a header rebuilds it with no help from the relay:

* :func:`listed_tensor`: a CPU tensor of at most :data:`LIST_LIMIT` elements of a common
  dtype crosses as ``tolist()``.  That call and the rebuild keep the GIL; the byte form's
  torch calls release it, and taking it back from the process's busy scheduler thread
  waits up to a switch interval (``bench/gil_probe.py``).  The rebuild goes through numpy
  where numpy has the dtype, which is faster than ``torch.tensor(values)`` parsing the list
  itself (``bench/results/code_figures.md``).  Values come back exactly, except a NaN's payload bits.
* :func:`inline_tensor`: any other small tensor crosses as its bytes; a CUDA one is
  rebuilt on the same device index, or refused by name (:func:`cuda_device`).

:class:`TensorKinds` is what the packer asks of torch per tensor, looked up once.  torch
is imported only when a tensor is rebuilt.
"""

from __future__ import annotations

from typing import Any

from omnitrio.errors import RelayError

LIST_LIMIT = 32
"""Inline CPU tensors of at most this many elements cross as a list of their values."""
LISTED_DTYPES = (
    *("float16", "bfloat16", "float32", "float64", "complex64", "complex128"),
    *("bool", "uint8", "int8", "int16", "int32", "int64"),
)
"""Dtypes whose values survive ``tolist()`` and back exactly; torch's wide unsigned ints
(barely supported) cross only as bytes."""
NUMPY_DTYPES = frozenset(LISTED_DTYPES) - {"bfloat16"}
"""Listed dtypes that numpy has under the same name: rebuilt through numpy."""


class TensorKinds:
    """What the packer asks of torch per tensor, looked up once per process."""

    def __init__(self, torch: Any) -> None:
        listed = [getattr(torch, name) for name in LISTED_DTYPES]
        plain = [*listed, *(getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name))]
        self.names: dict[Any, str] = {dtype: str(dtype).removeprefix("torch.") for dtype in plain}
        self.numpy_ok = frozenset(plain) - {torch.bfloat16}
        self.listable = frozenset(listed)
        self.strided = torch.strided
        self.uint8 = torch.uint8

    def name(self, t: Any) -> str | None:
        """The name of a dtype met for the first time (float8, complex32 …); None if quantized."""
        if t.is_quantized:
            return None
        name = self.names[t.dtype] = str(t.dtype).removeprefix("torch.")
        return name


def inline_tensor(
    data: bytearray, dtype: str, shape: tuple[int, ...], requires_grad: bool, cuda: int | None = None
) -> Any:
    """Rebuild a small tensor that rode inline in the header (it owns its bytes)."""
    import torch

    torch_dtype = getattr(torch, dtype)
    if len(data) == 0:
        t = torch.empty(shape, dtype=torch_dtype)
    else:
        t = torch.frombuffer(data, dtype=torch_dtype)
        if len(shape) != 1:
            t = t.view(shape)
    if cuda is not None:
        t = t.to(cuda_device(torch, f"cuda:{cuda}"))
    return t.requires_grad_(True) if requires_grad else t


def listed_tensor(values: Any, dtype: str, requires_grad: bool) -> Any:
    """Rebuild a tiny tensor that crossed as its values (see ``LIST_LIMIT``)."""
    import torch

    if dtype in NUMPY_DTYPES:
        import numpy

        t = torch.from_numpy(numpy.array(values, dtype=dtype))
    else:  # bfloat16
        t = torch.tensor(values, dtype=getattr(torch, dtype))
    return t.requires_grad_(True) if requires_grad else t


def cuda_device(torch: Any, name: str) -> Any:
    """The receiver's device for a tensor that left ``name``; a clear error if it has none."""
    device = torch.device(name)
    if not torch.cuda.is_available():
        raise RelayError(f"the payload holds a tensor on {name}, but this process sees no CUDA device")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise RelayError(
            f"the payload holds a tensor on {name}, but this process sees only {torch.cuda.device_count()} CUDA devices"
        )
    return device
