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

from toys.signal_exit import per_stage, serve_and_signal

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parent.parent
SPEECH_STAGES = ["ingress", "asr", "stream_asr", "responder", "tts", "text_out"]


@pytest.fixture(scope="module")
def tiny_qwen3_omni(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from schedulers.qwen3_omni.tiny import write_checkpoint

    torch.set_num_threads(1)
    return write_checkpoint(tmp_path_factory.mktemp("qwen3-omni") / "tiny", size="tiny")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_the_default_pipeline_stops_on_a_signal_with_every_stage_process_gone_in_time(
    signum: signal.Signals, tmp_path: Path
) -> None:
    serve = ["--config", str(ROOT / "configs" / "speech.toml"), *per_stage(SPEECH_STAGES)]
    exits = await serve_and_signal(serve, signum, tmp_path)
    assert_stopped_in_time(exits, set(SPEECH_STAGES))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_qwen3_omni_stops_on_a_signal_with_every_stage_process_gone_in_time(
    signum: signal.Signals, tmp_path: Path, tiny_qwen3_omni: Path
) -> None:
    serve = ["--config", str(ROOT / "configs" / "qwen3-omni.toml"), "--model", str(tiny_qwen3_omni)]
    exits = await serve_and_signal(serve, signum, tmp_path, kinds=("chat", "transcription", "realtime"))
    assert_stopped_in_time(exits, {"listen", "frontend", "thinker", "talker", "code2wav"})


def assert_stopped_in_time(exits: object, processes: set[str]) -> None:
    from toys.signal_exit import Exits

    assert isinstance(exits, Exits)
    assert exits.processes.keys() == processes
    assert exits.server_code == 0, exits.stderr
    assert exits.killed == [], exits.stderr
    assert [name for name, seconds in exits.processes.items() if seconds is None] == []
    assert exits.leftovers == []
