"""``python -m omnitrio``: help, check, run, and serving the default pipeline as a user would."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
import wave
from pathlib import Path

import httpx
import pytest

from omnitrio.cli import DEFAULT_CONFIG, main
from toys.speech_text import heard_as

ROOT = Path(__file__).resolve().parent.parent
TOY = """
name = "toy"
[[stages]]
name = "words"
factory_path = "toys.stages.create_words"
next = "tag"
[[stages]]
name = "tag"
factory_path = "toys.stages.create_tag"
factory = { tag = "seen" }
terminal = true
"""


def one_stage_toml(name: str, factory_path: str) -> str:
    """A pipeline config (TOML) named ``name`` of one terminal stage ``name`` built by ``factory_path``."""
    return f'\nname = "{name}"\n[[stages]]\nname = "{name}"\nfactory_path = "{factory_path}"\nterminal = true\n'


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipeline.toml"
    path.write_text(text)
    return path


def test_help_names_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0
    assert all(command in out for command in ("serve", "run", "check", "trace"))


def test_serve_help_shows_the_loopback_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "127.0.0.1" in capsys.readouterr().out


def test_check_prints_the_stage_graph_of_the_default_pipeline(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(DEFAULT_CONFIG)]) == 0
    out = capsys.readouterr().out
    assert "pipeline 'omnitrio-speech': 6 stages, entry 'ingress'" in out
    assert "responder" in out and "-> tts, text_out" in out


def test_check_of_a_bad_config_exits_2_naming_stage_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, TOY.replace('next = "tag"', 'next = "nowhere"'))
    assert main(["check", str(path)]) == 2
    assert "stages[0] ('words'): next: unknown stage 'nowhere'" in capsys.readouterr().err


def test_check_applies_set_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, TOY)
    assert main(["check", str(path), "--set", "tag.factory.tagx=1"]) == 2
    assert "does not accept ['tagx']" in capsys.readouterr().err


ROUTED = """
[[stages]]
name = "router"
factory_path = "toys.stages.create_echo"
next = ["a", "b"]
route_fn = "tests.route_stages.route_router"
[[stages]]
name = "a"
factory_path = "toys.stages.create_echo"
terminal = true
[[stages]]
name = "b"
factory_path = "toys.stages.create_echo"
terminal = true
"""


def test_check_does_not_warn_of_a_route_that_can_leave_a_terminal_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The runtime completes such a request with the terminals that answered: nothing to warn of.
    assert main(["check", str(write(tmp_path, ROUTED))]) == 0
    assert "warning" not in capsys.readouterr().err


def test_run_prints_the_result_of_one_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--config", str(write(tmp_path, TOY)), "hello omni world"]) == 0
    out = capsys.readouterr().out
    assert '"words": [' in out and '"seen"' in out


def test_run_of_a_failing_request_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, TOY)
    assert main(["run", "--config", str(path), '{"not": "text"}']) == 1
    assert "request failed" in capsys.readouterr().err


def test_trace_is_wired_to_omnitrio_trace(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("omnitrio.trace")
    assert main(["trace", "--help"]) == 0
    assert "python -m omnitrio trace" in capsys.readouterr().out


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def omnitrio(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "omnitrio", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_serve_on_a_busy_port_is_an_error_before_any_model_loads() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = omnitrio("serve", "--port", str(port))
        _, err = server.communicate(timeout=60)
    assert server.returncode == 1
    assert f"127.0.0.1:{port}" in err and "in use" in err
    assert "loads models" not in err


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def wait_for_health(url: str, server: subprocess.Popen[str], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert server.poll() is None, server.communicate()[1]
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    raise TimeoutError("the server did not become healthy")


@pytest.mark.slow
@pytest.mark.timeout(600)  # waits up to 120 s for a subprocess server loading the speech models, then talks to it
def test_default_pipeline_serves_the_openai_client_and_stops_on_sigint() -> None:
    pytest.importorskip("piper", reason="the speech extra is not installed")
    openai = pytest.importorskip("openai")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = omnitrio("serve", "--port", str(port), "--set", "responder.factory.mode=repeat")
    try:
        wait_for_health(url, server)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        sentence = "Turn left at the second traffic light."
        speech = client.audio.speech.create(
            model="omnitrio-speech", voice="alloy", input=sentence, response_format="wav"
        ).content
        with wave.open(io.BytesIO(speech)) as wav:
            assert (wav.getframerate(), wav.getsampwidth()) == (24_000, 2)
        heard = client.audio.transcriptions.create(model="omnitrio-speech", file=("turn.wav", speech)).text
        assert heard_as(heard, sentence)
        chat = client.chat.completions.create(
            model="omnitrio-speech", messages=[{"role": "user", "content": "Hi there."}]
        )
        assert chat.choices[0].message.content == "Hi there."
        spawned = children(server.pid)
    finally:
        server.send_signal(signal.SIGINT)
        _, err = server.communicate(timeout=30)
    assert server.returncode == 0, err
    assert "pipeline ready" in err and "stopped" in err
    assert not [pid for pid in spawned if Path(f"/proc/{pid}").exists()]
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=1)


def test_default_config_is_found_next_to_the_package() -> None:
    assert DEFAULT_CONFIG == ROOT / "configs" / "speech.toml" and DEFAULT_CONFIG.is_file()
    assert os.access(DEFAULT_CONFIG, os.R_OK)
