"""Where a model stage computes: every model family's ``device`` and ``dtype`` arguments, read once.

A stage factory that runs weights takes ``device: str = "cpu"`` and ``dtype: str = "float32"`` (the names
``serve --device/--dtype`` fill, :func:`omnitrio.config_loading.load`) and turns them into a
:class:`Placement` with :meth:`Placement.of`, which refuses what cannot run here before any weight is
read, naming the stage and the field:

* ``device``: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.  CUDA is only looked at when asked for (a ``"cpu"``
  stage never initialises it); ``"cuda"`` needs a torch that sees a CUDA device, ``"cuda:N"`` one that
  sees ``N + 1``.
* ``dtype``: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (a ``torch.dtype`` of those is taken too).

A stage builds its modules with :func:`build` (weights in ``dtype``, computed buffers in float32, as
``from_pretrained(dtype=...)`` has them; safe while other stages of the process build or serve in their
threads), moves them with :meth:`Placement.move`, moves its inputs with :meth:`Placement.put`, and hands
on what it computed with :func:`to_host`: **whatever device a stage computes on, what it hands another
stage is on the CPU, floating tensors in float32**, so any process reads it and a consumer in another
dtype casts it without loss (every dtype here widens exactly to float32).  A handoff that promises
otherwise says so in its docstring.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, TypeVar

import attrs
import torch

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The dtypes a stage may compute in, by the name a config uses."""

DEVICE_TYPES = ("cpu", "cuda")

M = TypeVar("M", bound=torch.nn.Module)


class PlacementError(ValueError):
    """A ``device`` or ``dtype`` a stage cannot use here; the message names the stage and the field."""


def _label(stage: str | None, field: str) -> str:
    return f"{stage}: {field}" if stage else field


def parse_device(device: str | torch.device, stage: str | None = None) -> torch.device:
    """``device`` as a ``torch.device`` this process can use (module docstring); :class:`PlacementError`
    otherwise.  Consults CUDA only when ``device`` names it."""
    where = _label(stage, "device")
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise PlacementError(f"{where}={device!r} is not a device; use 'cpu', 'cuda' or 'cuda:N'") from None
    if parsed.type not in DEVICE_TYPES:
        raise PlacementError(f"{where}={device!r}: only 'cpu', 'cuda' and 'cuda:N' are supported")
    if parsed.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise PlacementError(f"{where}={device!r}: this torch ({torch.__version__}) sees no CUDA device")
    count = torch.cuda.device_count()
    if parsed.index is not None and parsed.index >= count:
        names = ", ".join(f"cuda:{index}" for index in range(count))
        raise PlacementError(f"{where}={device!r}: this machine's CUDA devices are {names}")
    return parsed


def parse_dtype(dtype: str | torch.dtype, stage: str | None = None) -> torch.dtype:
    """``dtype`` (a name of :data:`DTYPES`, or one of those torch dtypes) as a ``torch.dtype``;
    :class:`PlacementError` otherwise."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise PlacementError(f"{_label(stage, 'dtype')}={dtype!r} is not one of {', '.join(DTYPES)}")


@attrs.frozen
class Placement:
    """One stage's device and dtype, checked (:meth:`of`)."""

    device: torch.device = attrs.field(factory=lambda: torch.device("cpu"))
    dtype: torch.dtype = torch.float32

    @classmethod
    def of(
        cls, stage: str | None, device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32"
    ) -> Placement:
        """A stage factory's ``device`` and ``dtype`` arguments, checked (module docstring); errors name
        ``stage`` (None: the field alone, as ``omnitrio check`` prints it after the stage)."""
        return cls(parse_device(device, stage), parse_dtype(dtype, stage))

    def build(self, cls: Any, config: Any) -> Any:
        """:func:`build` in :attr:`dtype` (on the CPU; move it with :meth:`move` once filled)."""
        return build(cls, config, self.dtype)

    def move(self, module: M) -> M:
        """``module`` (its parameters and buffers) on :attr:`device`, in eval mode; dtypes unchanged."""
        return module.to(self.device).eval()

    def put(self, tensor: torch.Tensor) -> torch.Tensor:
        """An input ``tensor`` on :attr:`device`; floating tensors in :attr:`dtype`, others unchanged."""
        if tensor.is_floating_point():
            return tensor.to(self.device, self.dtype)
        return tensor.to(self.device)


_BUILDING = threading.Lock()


@contextlib.contextmanager
def uninitialised() -> Iterator[None]:
    """Modules made inside are not initialised (their weights are garbage until a checkpoint fills
    them), one thread of the process at a time.

    transformers' ``no_init_weights`` swaps torch's init functions for no-ops *process-wide* and puts
    back what it found: two stages of one process building side by side in their threads would leave
    the no-ops in place for good (any later model in the process silently uninitialised), so every
    build goes through this lock."""
    from transformers.initialization import no_init_weights

    with _BUILDING, no_init_weights():
        yield


def build(cls: Any, config: Any, dtype: torch.dtype) -> Any:
    """The transformers model ``cls`` (a ``PreTrainedModel``) from ``config``, its weights left
    uninitialised for the checkpoint to fill (:func:`uninitialised`), on the current device
    (``torch.device("meta")`` as a context works): its weights in ``dtype`` (:func:`cast_weights`).

    ``cls._from_config(config, dtype=...)`` sets torch's default dtype while it builds, and that default is
    one per process: a stage building in bfloat16 would hand it to the stages serving beside it in other
    threads (float32 code that suddenly makes bfloat16 tensors).  Here the module is built in float32,
    which is what the default stays, and cast after."""
    with uninitialised():
        module = cls._from_config(config, dtype=torch.float32)
    return cast_weights(module, dtype)


def cast_weights(module: M, dtype: torch.dtype) -> M:
    """``module`` with its weights (the floating tensors of its state dict: parameters, persistent
    buffers) in ``dtype``, in place; the buffers it computes itself and does not save (rotary
    frequencies, position tables) keep the dtype they were computed in, as ``from_pretrained`` keeps them."""
    saved = set(module.state_dict())
    computed = {name: buffer for name, buffer in module.named_buffers() if name not in saved}
    module.to(dtype)
    for name, buffer in computed.items():
        owner, _, leaf = name.rpartition(".")
        setattr(module.get_submodule(owner), leaf, buffer)
    return module


def check_placement(*, device: str = "cpu", dtype: str = "float32", **_: Any) -> None:
    """What ``omnitrio check`` asks of a stage factory's arguments (its ``preflight``): are its ``device``
    and ``dtype`` usable here?  :class:`PlacementError` naming the field when not; reads no weights."""
    Placement.of(None, device, dtype)


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """What a stage hands on (module docstring): ``tensor`` on the CPU, float32 when floating, a copy
    of its own (never a view of the stage's buffers) that a consumer may keep; called outside
    ``torch.inference_mode`` it is a plain tensor any code may use."""
    dtype = torch.float32 if tensor.is_floating_point() else tensor.dtype
    return tensor.detach().to("cpu", dtype, copy=True)


__all__ = [
    "DTYPES",
    "Placement",
    "PlacementError",
    "build",
    "cast_weights",
    "check_placement",
    "parse_device",
    "parse_dtype",
    "to_host",
    "uninitialised",
]
