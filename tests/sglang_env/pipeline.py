"""The pipeline the SGLang tests serve: ChatML preprocess → an SGLang thinker → the text relay.

:func:`pipeline_toml` writes it (with a recorder of the thinker's result as a second terminal when
``hidden`` is set) for ``omnitrio check`` and ``load``; the engine's arguments are a GPU's until a test
overrides them for the CPU.  Importing this module imports no ``sglang``.
"""

from __future__ import annotations

from pathlib import Path

THINKER = "schedulers.ar.sglang_backend.create_sglang_scheduler"

_BASE = """
name = "sglang-thinker"
serves = ["chat"]
startup_timeout = 900

[[stages]]
name = "preprocess"
factory_path = "schedulers.ar.sglang_stages.create_chatml_preprocess_stage"
factory = {{ max_new_tokens = 512, hidden_states = {hidden} }}
next = "thinker"

[[stages]]
name = "thinker"
process = "thinker"
factory_path = "{thinker}"
next = {next}
stream_to = ["detokenize"]

[stages.factory]
model_path = "Qwen/Qwen3-8B"
mem_fraction_static = 0.8
enable_return_hidden_states = {hidden}
scheduler_args = {{ stream = true, max_running_requests = 64 }}

[[stages]]
name = "detokenize"
process = "thinker"
factory_path = "schedulers.ar.sglang_stages.create_text_relay_stage"
terminal = true
can_accept_stream_before_payload = true
"""

_RECORDER = """
[[stages]]
name = "hidden"
factory_path = "{recorder}"
terminal = true
"""


def pipeline_toml(directory: Path, *, recorder: str | None = None) -> Path:
    """Write the pipeline into ``directory``; ``recorder`` (a factory path) also gets the thinker's result."""
    hidden = "true" if recorder else "false"
    nexts = '["detokenize", "hidden"]' if recorder else '"detokenize"'
    text = _BASE.format(hidden=hidden, thinker=THINKER, next=nexts)
    if recorder:
        text += _RECORDER.format(recorder=recorder)
    path = directory / "sglang-thinker.toml"
    path.write_text(text.lstrip())
    return path
