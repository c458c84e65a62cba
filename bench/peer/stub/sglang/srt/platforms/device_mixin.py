"""Stand-in for ``sglang.srt.platforms.device_mixin``: device predicates, all False by default."""

from __future__ import annotations

import enum


class DeviceMixin:
    device_type = "cpu"

    def is_cuda(self) -> bool:
        return False

    def is_rocm(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_npu(self) -> bool:
        return False

    def is_mps(self) -> bool:
        return False

    def is_musa(self) -> bool:
        return False

    def is_cuda_alike(self) -> bool:
        return self.is_cuda() or self.is_rocm()

    def get_device(self, index: int = 0) -> str:
        return self.device_type

    def set_device(self, device: object) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def empty_cache(self) -> None:
        return None


class PlatformEnum(enum.Enum):
    CUDA = "cuda"
    ROCM = "rocm"
    CPU = "cpu"
    XPU = "xpu"
    NPU = "npu"
    MPS = "mps"
    MUSA = "musa"
    UNSPECIFIED = "unspecified"
