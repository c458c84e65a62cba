"""The runnable examples do what the README says they do, inline and in stage processes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from examples import words

ROOT = Path(__file__).resolve().parent.parent
PRINTED = [
    "{'text': 'HELLO OMNI WORLD', 'count': 3}",
    "SAY SOMETHING NICE | {'text': 'SAY SOMETHING NICE', 'count': 3}",
    "['count', 'join', 'split', 'upper']",
]


def test_the_readme_shows_the_example_as_it_is() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert (ROOT / "examples" / "words.py").read_text() in blocks
    assert "\n".join(f"    {line}" for line in PRINTED) in readme


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "processes"])
async def test_the_words_example_streams_its_answer(inline: bool, capsys: pytest.CaptureFixture[str]) -> None:
    await words.main(inline=inline)
    assert capsys.readouterr().out.splitlines() == PRINTED


async def test_the_join_stage_streams_one_chunk_per_word() -> None:
    from omnitrio import StreamMessage, open_pipeline

    async with open_pipeline(words.CONFIG, inline=True) as pipeline:
        async with pipeline.stream("w", "one two three") as stream:
            chunks = [m.chunk async for m in stream if isinstance(m, StreamMessage)]
    assert chunks == ["ONE ", "TWO ", "THREE "]
