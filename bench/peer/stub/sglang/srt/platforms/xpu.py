"""Stand-in for ``sglang.srt.platforms.xpu``: only the mixin class, never selected on CPU."""

from sglang.srt.platforms.device_mixin import DeviceMixin


class XpuDeviceMixin(DeviceMixin):
    device_type = "xpu"
