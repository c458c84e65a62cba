"""Stand-in for ``sglang.srt.arg_groups``."""
