"""Stand-in for ``sglang.srt`` (see ``sglang/__init__.py``)."""
