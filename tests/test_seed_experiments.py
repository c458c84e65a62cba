"""The seed chapter's three experiments print exactly the seed's output.

The stage modules in toys/seed/ are the seed's, with only their imports changed; the
drivers are rewritten for trio.  Each runs inline here; one process per stage in
test_processes.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from omnitrio import open_pipeline
from toys.seed import ch4_batch, ch4_fanin, ch4_stream

FANIN_OUTPUT = """\
{'sources': ['count', 'upper'], 'count': 3, 'count_saw': ['words'], 'upper': 'HELLO OMNI WORLD', 'upper_saw': ['text']}
{'sources': ['count', 'upper'], 'count': 3, 'count_saw': ['words'], 'upper': 'STAGE BY STAGE', 'upper_saw': ['text']}
"""

BATCH_OUTPUT = """\
batch_wait_when_idle=True
  同时到达的 4 个请求，各自所在批的大小： [4, 4, 4, 4]
  单独一个请求：批大小 1，多等了 200 ms 吗：True
batch_wait_when_idle=False
  同时到达的 4 个请求，各自所在批的大小： [4, 4, 4, 4]
  单独一个请求：批大小 1，多等了 200 ms 吗：False
"""

STREAM_OUTPUT = """\
流式块 #0 来自 vocoder：{'samples': [100, 200]}
流式块 #1 来自 vocoder：{'samples': [1100, 1200]}
流式块 #2 来自 vocoder：{'samples': [2100, 2200]}
完成 来自 vocoder：{'total_samples': 6}
"""


# Each experiment's driver and the output the seed printed for it.
SEEDS: dict[str, tuple[Any, str]] = {
    "fan_out_fan_in": (ch4_fanin, FANIN_OUTPUT),
    "batching_window": (ch4_batch, BATCH_OUTPUT),
    "streaming": (ch4_stream, STREAM_OUTPUT),
}


async def assert_prints_the_seed_output(name: str, inline: bool, capsys: pytest.CaptureFixture[str]) -> None:
    """The experiment ``name`` (a key of :data:`SEEDS`) prints exactly what the seed printed."""
    experiment, output = SEEDS[name]
    await experiment.main(inline=inline)
    assert capsys.readouterr().out == output


@pytest.mark.parametrize("name", list(SEEDS))
async def test_seed_experiment_prints_the_seed_output(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    await assert_prints_the_seed_output(name, True, capsys)


async def ten_bursts_form_one_batch_each(inline: bool) -> None:
    """Ten times four requests submitted together to the seed's batching stage: each forms one batch of 4."""
    async with open_pipeline(ch4_batch.make_config(False), inline=inline) as pipeline:
        for round_ in range(10):
            sizes: list[int] = []

            async def one(i: int, round_: int, sizes: list[int]) -> None:
                sizes.append((await pipeline.submit(f"b{round_}-{i}", i))["batch_size"])

            async with trio.open_nursery() as nursery:
                for i in range(4):
                    nursery.start_soon(one, i, round_, sizes)
            assert sizes == [4, 4, 4, 4]


async def test_seed_burst_forms_one_batch_every_time_without_idle_wait() -> None:
    """The reference splits this burst in about 1 run of 5; the atomic inbox hand-off never does."""
    await ten_bursts_form_one_batch_each(inline=True)
