"""Every shipped config, served with its stages in processes of their own, stops on SIGINT and on SIGTERM
with requests in flight: the server exits 0, every stage process is gone and none was killed for
outliving the stop grace, and nothing is left in /dev/shm or the temporary directory.

The default pipeline (configs/speech.toml) gets one process per stage; each omni family (served as a user
serves it, ``--model DIR`` on a tiny checkpoint this module writes, which picks the family's shipped
config) runs in the processes its config names.
``bench/exits.py`` repeats the same many times and reports the slowest exits.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from omnitrio.config_loading import load
from omnitrio.families import FAMILIES, config_for, write_tiny_model
from tests.startup_helpers import short_tmp
from toys.signal_exit import per_stage, serve_and_signal

__all__ = ["short_tmp"]  # fixtures

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


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def tiny_family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """(an omni family, a tiny random checkpoint of it)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    torch.set_num_threads(1)
    family: str = request.param
    return family, write_tiny_model(family, tmp_path_factory.mktemp(family) / "tiny")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_each_omni_family_stops_on_a_signal_with_every_stage_process_gone_in_time(
    signum: signal.Signals, short_tmp: Path, tiny_family: tuple[str, Path]
) -> None:
    family, model = tiny_family
    config = load(config_for(family), model=model, process_factories=False)
    processes = {stage.process for stage in config.stages if stage.process is not None}
    exits = await serve_and_signal(
        ["--model", str(model)], signum, short_tmp, kinds=("chat", "transcription", "realtime")
    )
    assert_stopped_in_time(exits, processes)


def assert_stopped_in_time(exits: object, processes: set[str]) -> None:
    from toys.signal_exit import Exits

    assert isinstance(exits, Exits)
    assert exits.processes.keys() == processes
    assert exits.server_code == 0, exits.stderr
    assert exits.killed == [], exits.stderr
    assert [name for name, seconds in exits.processes.items() if seconds is None] == []
    assert exits.leftovers == []
