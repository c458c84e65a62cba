"""Every shipped config, served with its stages in processes of their own, stops on SIGINT and on SIGTERM
with requests in flight: the server exits 0, every stage process is gone and none was killed for
outliving the stop grace, and nothing is left in /dev/shm or the temporary directory.

The default pipeline (configs/speech.toml) gets one process per stage; Qwen3-Omni
(configs/qwen3-omni.toml, on a tiny checkpoint this module writes) runs in the processes it names.
``bench/exits.py`` repeats the same many times and reports the slowest exits.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.startup_helpers import short_tmp, tiny_qwen3_omni
from toys.signal_exit import per_stage, serve_and_signal

__all__ = ["short_tmp", "tiny_qwen3_omni"]  # fixtures

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parent.parent
SPEECH_STAGES = ["ingress", "asr", "stream_asr", "responder", "tts", "text_out"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_the_default_pipeline_stops_on_a_signal_with_every_stage_process_gone_in_time(
    signum: signal.Signals, short_tmp: Path
) -> None:
    serve = ["--config", str(ROOT / "configs" / "speech.toml"), *per_stage(SPEECH_STAGES)]
    exits = await serve_and_signal(serve, signum, short_tmp)
    assert_stopped_in_time(exits, set(SPEECH_STAGES))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_qwen3_omni_stops_on_a_signal_with_every_stage_process_gone_in_time(
    signum: signal.Signals, short_tmp: Path, tiny_qwen3_omni: Path
) -> None:
    serve = ["--config", str(ROOT / "configs" / "qwen3-omni.toml"), "--model", str(tiny_qwen3_omni)]
    exits = await serve_and_signal(serve, signum, short_tmp, kinds=("chat", "transcription", "realtime"))
    assert_stopped_in_time(exits, {"listen", "frontend", "thinker", "talker", "code2wav"})


def assert_stopped_in_time(exits: object, processes: set[str]) -> None:
    from toys.signal_exit import Exits

    assert isinstance(exits, Exits)
    assert exits.processes.keys() == processes
    assert exits.server_code == 0, exits.stderr
    assert exits.killed == [], exits.stderr
    assert [name for name, seconds in exits.processes.items() if seconds is None] == []
    assert exits.leftovers == []
