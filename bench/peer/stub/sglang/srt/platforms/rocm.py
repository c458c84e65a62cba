"""Stand-in for ``sglang.srt.platforms.rocm``: only the mixin class, never selected on CPU."""

from sglang.srt.platforms.device_mixin import DeviceMixin


class RocmDeviceMixin(DeviceMixin):
    device_type = "rocm"
