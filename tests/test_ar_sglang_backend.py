"""SGLangScheduler against a fake engine with SGLang's streaming output shape (and a real one on GPU)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from omnitrio import PipelineConfig, StageConfig, open_pipeline
from omnitrio.contract import IncomingMessage, OmniRequest, StageOverloaded, StagePayload
from omnitrio.errors import StartupError
from schedulers.ar.sglang_backend import SGLangScheduler, create_sglang_scheduler, per_token_hidden_states, shut_down
from schedulers.ar.sglang_stages import chatml_prompt
from tests.scheduler_harness import outputs_until_done
from tests.sglang_env.pipeline import pipeline_toml


class FakeSGLangEngine:
    """Like ``sglang.Engine``: cumulative ``text`` + ``meta_info``; hangs-equivalent error off its own loop."""

    def __init__(self, delay: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.delay = delay
        self.calls: list[dict[str, Any]] = []
        self.aborted: list[str] = []
        self.shut_down = False

    async def async_generate(self, *, sampling_params: dict, stream: bool, rid: str, **prompt: Any) -> AsyncIterator:
        if asyncio.get_running_loop() is not self.loop:
            raise RuntimeError("streamed from a loop the engine was not created on")
        self.calls.append({"sampling_params": sampling_params, "stream": stream, "rid": rid, **prompt})
        n = sampling_params["max_new_tokens"]

        async def outputs() -> AsyncIterator[dict[str, Any]]:
            text = ""
            for i in range(n):
                await asyncio.sleep(self.delay)
                if rid in self.aborted:
                    return
                text += f"w{i} "
                finish = {"type": "length", "length": n} if i == n - 1 else None
                meta = {"id": rid, "finish_reason": finish, "prompt_tokens": 3, "completion_tokens": i + 1}
                yield {"text": text, "output_ids": list(range(i + 1)), "meta_info": meta}

        return outputs()

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.aborted.append(rid)

    def shutdown(self) -> None:
        self.shut_down = True


@pytest.fixture
def fake() -> Iterator:
    """Build a scheduler over a fake engine, run it in a thread; stop it and join at the end."""
    running: list[tuple[SGLangScheduler, threading.Thread]] = []
    engines: list[FakeSGLangEngine] = []

    def start(delay: float = 0.0, **args: Any) -> tuple[SGLangScheduler, list[FakeSGLangEngine]]:
        def factory() -> FakeSGLangEngine:
            engines.append(FakeSGLangEngine(delay))
            return engines[-1]

        scheduler = SGLangScheduler(factory, **args)
        thread = threading.Thread(target=scheduler.start)
        thread.start()
        running.append((scheduler, thread))
        return scheduler, engines

    yield start
    for scheduler, thread in running:
        scheduler.stop()
        thread.join(timeout=10)
        assert not thread.is_alive()
    assert all(engine.shut_down for engine in engines)


def new_request(rid: str, data: object, **params: object) -> IncomingMessage:
    return IncomingMessage(rid, "new_request", StagePayload(rid, OmniRequest(data, params=dict(params)), data))


def test_cumulative_engine_text_is_streamed_as_deltas(fake) -> None:
    scheduler, _ = fake()
    scheduler.inbox.put(new_request("r", "hello", max_new_tokens=4, stream=True))
    outputs = outputs_until_done(scheduler, {"r"})
    assert [o.data["text"] for o in outputs if o.type == "stream"] == ["w0 ", "w1 ", "w2 ", "w3 "]
    assert all(o.metadata == {"modality": "text"} for o in outputs if o.type == "stream")
    result = outputs[-1].data.data
    assert (result["text"], result["finish_reason"], result["output_token_ids"]) == (
        "w0 w1 w2 w3 ",
        "length",
        [0, 1, 2, 3],
    )


def test_prompt_and_sampling_params_reach_the_engine(fake) -> None:
    scheduler, engines = fake()
    scheduler.inbox.put(new_request("text", "hi there", max_new_tokens=2))
    scheduler.inbox.put(new_request("ids", {"prompt_token_ids": [5, 6]}, max_new_tokens=1, ignore_eos=True))
    outputs_until_done(scheduler, {"text", "ids"})
    calls = {call["rid"]: call for call in engines[0].calls}
    assert calls["text"]["prompt"] == "hi there"
    assert calls["ids"]["input_ids"] == [5, 6]
    assert calls["ids"]["sampling_params"] == {"max_new_tokens": 1, "temperature": 0.0, "ignore_eos": True}
    assert all(call["stream"] for call in calls.values())


def test_abort_calls_the_engine_abort_and_frees_the_slot(fake) -> None:
    scheduler, engines = fake(delay=0.005, max_running_requests=1)
    scheduler.inbox.put(new_request("long", "x", max_new_tokens=1000, stream=True))
    scheduler.inbox.put(new_request("next", "y", max_new_tokens=2))
    assert scheduler.outbox.get(timeout=10).request_id == "long"
    scheduler.abort("long")
    outputs = outputs_until_done(scheduler, {"next"})
    assert outputs[-1].type == "result"
    assert engines[0].aborted == ["long"]
    assert not [o for o in outputs if o.request_id == "long" and o.type != "stream"]


def test_full_waiting_queue_answers_with_stage_overloaded(fake) -> None:
    scheduler, _ = fake(delay=0.05, max_running_requests=1, max_waiting_requests=1)
    for rid in "abc":
        scheduler.inbox.put(new_request(rid, "p", max_new_tokens=3))
    outputs = {o.request_id: o for o in outputs_until_done(scheduler, {"a", "b", "c"}) if o.type != "stream"}
    assert isinstance(outputs["c"].data, StageOverloaded)
    assert (outputs["a"].type, outputs["b"].type) == ("result", "result")


def test_bad_payload_fails_with_a_clear_error(fake) -> None:
    scheduler, _ = fake()
    scheduler.inbox.put(new_request("bad", {"neither": 1}))
    (out,) = outputs_until_done(scheduler, {"bad"})
    assert out.type == "error" and "prompt must be text" in str(out.data)


def test_engine_start_failure_is_reported_by_warm_up() -> None:
    def broken() -> Any:
        raise OSError("no GPU here")

    scheduler = SGLangScheduler(broken)
    with pytest.raises(RuntimeError, match="no GPU here"):
        scheduler.warm_up_serving_thread()


@pytest.mark.gpu
def test_real_sglang_engine_streams_text() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pytest.importorskip("sglang")
    model_path = os.environ.get("OMNITRIO_SGLANG_MODEL")
    if not model_path:
        pytest.skip("set OMNITRIO_SGLANG_MODEL to a local model directory")
    scheduler = create_sglang_scheduler(model_path, mem_fraction_static=0.5)
    thread = threading.Thread(target=scheduler.start)
    thread.start()
    try:
        scheduler.inbox.put(new_request("g", "The capital of France is", max_new_tokens=8, stream=True))
        outputs = outputs_until_done(scheduler, {"g"})
        streamed = "".join(o.data["text"] for o in outputs if o.type == "stream")
        assert outputs[-1].type == "result"
        assert streamed == outputs[-1].data.data["text"]
    finally:
        scheduler.stop()
        thread.join(timeout=60)


def test_hidden_states_are_one_row_per_output_token() -> None:
    prefill = [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]  # one row per prompt position; the last made token 1
    hidden = per_token_hidden_states([prefill, [3.0, 3.0], [4.0, 4.0]])
    assert hidden.dtype == torch.float32
    assert hidden.tolist() == [[2.0, 2.0], [3.0, 3.0], [4.0, 4.0]]


def test_return_hidden_states_is_asked_of_the_engine(fake) -> None:
    scheduler, engines = fake()
    scheduler.inbox.put(new_request("h", "hi", max_new_tokens=2, return_hidden_states=True))
    scheduler.inbox.put(new_request("plain", "hi", max_new_tokens=2))
    outputs_until_done(scheduler, {"h", "plain"})
    calls = {call["rid"]: call for call in engines[0].calls}
    assert calls["h"]["return_hidden_states"] is True
    assert "return_hidden_states" not in calls["plain"]


# Like glibc's sem_open: map a temporary file, link it to its name, remove the temporary name.
MAPS_AND_WAIT = """
import mmap, os, sys, time
temporary = sys.argv[1] + ".tmp"
with open(temporary, "w+b") as f:
    f.write(bytes(64))
    f.flush()
    mapped = mmap.mmap(f.fileno(), 0)
os.link(temporary, sys.argv[1])
os.unlink(temporary)
print("mapped", flush=True)
time.sleep(60)
"""


class ChildEngine:
    """An engine with one child process that maps a file in /dev/shm; shutdown kills the child."""

    def __init__(self, path: Path) -> None:
        self.child = subprocess.Popen([sys.executable, "-c", MAPS_AND_WAIT, str(path)], stdout=subprocess.PIPE)
        assert self.child.stdout is not None and self.child.stdout.readline() == b"mapped\n"

    def get_all_child_pids(self) -> list[int]:
        return [self.child.pid]

    def shutdown(self) -> None:
        self.child.kill()
        self.child.wait()


def test_shutdown_removes_the_shm_files_the_engine_children_mapped_and_no_other() -> None:
    tag = uuid.uuid4().hex[:8]
    own, other = Path(f"/dev/shm/sglang_loads_omnitrio-test-{tag}.shm"), Path(f"/dev/shm/sem.mp-omnitrio-test-{tag}")
    try:
        other.write_bytes(bytes(64))
        shut_down(ChildEngine(own))
        assert not own.exists()
        assert other.exists()
    finally:
        for path in (own, other):
            path.unlink(missing_ok=True)


def test_check_names_what_to_install_when_sglang_is_missing_and_exits_2_as_its_help_says(tmp_path: Path) -> None:
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is installed here (tests/test_sglang_engine.py checks the config with it)")
    config = pipeline_toml(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "omnitrio", "check", str(config)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2
    assert "stage 'thinker': needs the `sglang` package" in done.stderr
    assert "pip install 'omnitrio[sglang]'" in done.stderr


def test_a_pipeline_with_an_sglang_thinker_loads_without_importing_sglang(tmp_path: Path) -> None:
    probe = (
        "import sys\n"
        "from pathlib import Path\n"
        "from omnitrio.config_loading import load\n"
        "from tests.sglang_env.pipeline import THINKER, pipeline_toml\n"
        f"config = load(pipeline_toml(Path({str(tmp_path)!r}), recorder='toys.stages.create_echo'))\n"
        "assert config.stage('thinker').factory_path == THINKER\n"
        "print('sglang' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=root)
    assert done.stdout.split() == ["False"]


def create_unstartable() -> SGLangScheduler:
    def broken() -> Any:
        raise OSError("no GPU here")

    return SGLangScheduler(broken)


async def test_an_engine_that_fails_to_start_fails_pipeline_start_up_naming_the_stage() -> None:
    stage = StageConfig(name="thinker", factory_path=f"{__name__}.create_unstartable", terminal=True)
    config = PipelineConfig(name="unstartable", stages=[stage])
    for _ in range(10):  # the stage must never report ready first, whichever task trio runs first
        with pytest.raises(StartupError, match=r"stage 'thinker': scheduler failed to start: .*no GPU here"):
            async with open_pipeline(config, inline=True):
                pass


def test_chatml_prompt_renders_the_text_turns_and_refuses_media_naming_the_part() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]},
    ]
    assert chatml_prompt({"task": "chat", "messages": messages}) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"
    )
    assert chatml_prompt("Hi") == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    with pytest.raises(ValueError, match=r"messages\[0\]\.content\[1\]: only text parts .* 'input_audio'"):
        chatml_prompt({"task": "chat", "messages": [{"role": "user", "content": [messages[1]["content"][0], audio]}]})
