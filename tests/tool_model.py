"""A small model that can be offered tools: SmolLM2-135M-Instruct's float file with a Hermes-style chat template.

No registry package ships a tool-capable GGUF small enough for the tests, and SmolLM2's own template
has no place for tools.  :func:`hermes_smollm2` writes a copy of SmolLM2's F16 file whose
``tokenizer.chat_template`` is :data:`HERMES_TEMPLATE`: the layout Qwen2.5 and Hermes models use (the
tools as JSON inside ``<tools></tools>`` in the system turn, each call answered in
``<tool_call></tool_call>``, each tool output in ``<tool_response></tool_response>``), written here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

HERMES_TEMPLATE: Final = """\
{%- if messages[0].role == 'system' %}{% set system = messages[0].content %}{% set rest = messages[1:] %}
{%- else %}{% set system = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' %}\
{% set rest = messages %}{% endif %}
{{- '<|im_start|>system\\n' + system }}
{%- if tools %}
{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'
    'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{ '\\n' + tool | tojson }}{% endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within '
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}'
    '\\n</tool_call>' }}
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- for message in rest %}
{%- if message.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + message.content }}
{%- for call in message.tool_calls or [] %}
{{- '\\n<tool_call>\\n{"name": "' + call.function.name + '", "arguments": ' + call.function.arguments | tojson
    + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}
"""


def hermes_smollm2(source: Path, target: Path) -> Path:
    """Write ``source`` (a GGUF file) to ``target`` with :data:`HERMES_TEMPLATE` as its chat template."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(str(source))
    architecture = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(str(target), arch=architecture, endianess=reader.endianess)
    alignment = reader.fields.get(gguf.Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = alignment.contents()
    template = MetadataDetails(gguf.GGUFValueType.STRING, HERMES_TEMPLATE)
    copy_with_new_metadata(reader, writer, {gguf.Keys.Tokenizer.CHAT_TEMPLATE: template}, [])
    return target
