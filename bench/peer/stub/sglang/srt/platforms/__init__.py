"""Stand-in for ``sglang.srt.platforms``: a CPU platform is all the toy pipelines meet."""

from sglang.srt.platforms.cpu import CpuPlatform

current_platform = CpuPlatform()
