"""Stand-in for ``sglang.srt.platforms.cuda``: only the mixin class, never selected on CPU."""

from sglang.srt.platforms.device_mixin import DeviceMixin


class CudaDeviceMixin(DeviceMixin):
    device_type = "cuda"
