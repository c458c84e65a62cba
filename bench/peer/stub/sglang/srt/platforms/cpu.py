"""Stand-in for ``sglang.srt.platforms.cpu``."""

from __future__ import annotations

from sglang.srt.platforms.device_mixin import DeviceMixin
from sglang.srt.platforms.interface import SRTPlatform


class CpuDeviceMixin(DeviceMixin):
    device_type = "cpu"

    def is_cpu(self) -> bool:
        return True


class CpuPlatform(CpuDeviceMixin, SRTPlatform):
    """The platform ``current_platform`` reports on a machine without accelerators."""
