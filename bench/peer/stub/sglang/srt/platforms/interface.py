"""Stand-in for ``sglang.srt.platforms.interface``."""

from __future__ import annotations

from sglang.srt.platforms.device_mixin import DeviceMixin


class SRTPlatform(DeviceMixin):
    """Base of sglang's platform classes; sglang-omni checks subclassing and the ``is_*`` answers."""
