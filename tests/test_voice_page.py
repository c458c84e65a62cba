"""The voice page at ``/``, in a real browser: Debian's chromium driven by Playwright, hearing a WAV
that the server's own voice (Piper) spoke as its microphone.

The server is ``python -m omnitrio serve`` with an API key and the "repeat" responder (it says the
user's words back), so every answer is known. Each behaviour runs over both transports the page
has, the WebSocket and WebRTC. What the page measured is read from ``window.voiceStats``; what a
person sees is read from the page. Screenshots go to ``tests/artifacts/`` (kept, not committed).
"""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import playwright.sync_api as playwright_api
import pytest

from toys.browser import RATE, Server, chromium_page, page_server, speech_wav

pytest.importorskip("piper", reason="the speech extra is not installed")
# The first test also installs chromium (apt) and starts the server with its models.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

KEY = "sk-voice-page"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
PACKAGE = Path(__file__).resolve().parent.parent / "omnitrio" / "serve"
QUESTION = "What is the capital of France?"
TYPED = "Turn left at the second traffic light."
# Long enough that its spoken answer is still playing when the microphone's interruption comes.
LONG = (
    "The train to Boston leaves from platform seven. The library closes at nine. We need chairs for the room."
    " Bring your own lunch on Friday. The meeting moves to room four. Call me when you land. See you soon."
    " The weather will be sunny and warm tomorrow. My phone battery is almost empty. Please send the report"
    " to my office before Friday. She bought three apples and two oranges at the market."
)  # about 20 s spoken: the interruption 10 s in lands while it plays, even if the answer starts late
INTERRUPTION = "Stop. Wait a moment please."
TURN = 90_000  # ms a turn may take on a loaded machine
TRANSPORTS = ["websocket", "webrtc"]
JITTER_MS = 1500  # the most a browser's WebRTC jitter buffer may hold on a loaded machine


def served_page(key: str) -> Iterator[Server]:
    """The page's server with API key ``key`` (a module fixture yields from it); skips, saying why, without one."""
    with page_server(key) as running:
        if isinstance(running, str):
            pytest.skip(running)
        yield running


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from served_page(KEY)


@pytest.fixture(scope="module")
def microphones(server: Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("microphone")
    return {
        # Chromium's fake microphone plays from capture, before a WebRTC call connects: the silence first
        # keeps the question whole however long the connection takes.
        "question": speech_wav(server, folder / "question.wav", [3.0, QUESTION, 4.0], key=KEY),
        "silence": speech_wav(server, folder / "silence.wav", [1.0], key=KEY),
        "interruption": speech_wav(server, folder / "interruption.wav", [10.0, INTERRUPTION, 4.0], key=KEY),
    }


@pytest.fixture(scope="module")
def playwright() -> Iterator[Any]:
    with playwright_api.sync_playwright() as running:
        yield running


def start(page: Any, transport: str, key: str | None = KEY) -> None:
    """What a person does: the key (none for a server without one), the connection under Settings, then
    Start talking."""
    if key is not None:
        page.fill("#key", key)
    page.click("summary")
    page.select_option("#transport", transport)
    page.click("#talk")


# The first turn answered: its latency measured, its response done, the page listening again.
ANSWERED = "s.latencies.length > 0 && s.events.includes('response.done') && s.state === 'LISTENING'"


def assert_answer_played(seen: dict[str, Any], transport: str, samples: int) -> None:
    """More than ``samples`` of the answer reached the speakers (WebSocket: the page's own count; WebRTC: the
    browser's output buffer started and stopped)."""
    if transport == "websocket":
        assert max(seen["played"].values()) > samples
    else:
        assert seen["events"].index("output_audio_buffer.started") < seen["events"].index("output_audio_buffer.stopped")


def stats(page: Any) -> dict[str, Any]:
    return page.evaluate("window.voiceStats")  # type: ignore[no-any-return]


def wait_for(page: Any, condition: str, timeout: int = TURN) -> None:
    """Until ``condition`` (JavaScript; ``s`` is ``window.voiceStats``) holds; a timeout shows the stats."""
    try:
        page.wait_for_function(f"(() => {{ const s = window.voiceStats; return {condition}; }})()", timeout=timeout)
    except playwright_api.TimeoutError:
        shown = {key: value for key, value in stats(page).items() if key != "events"}
        events = [kind for kind in stats(page)["events"] if not kind.endswith(".delta")]
        raise AssertionError(f"not {condition} after {timeout} ms: {shown}, events {events}") from None


def transcript(page: Any, role: str) -> list[str]:
    return page.locator(f"#transcript li.{role}").all_inner_texts()  # type: ignore[no-any-return]


def screenshot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def words(text: str) -> str:
    return " ".join("".join(c for c in text.lower() if c.isalnum() or c.isspace()).split())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_spoken_question_is_transcribed_and_its_answer_played(
    server: Server, microphones: dict[str, Path], playwright: Any, transport: str
) -> None:
    with chromium_page(playwright, microphones["question"], server.url) as page:
        start(page, transport)
        wait_for(page, ANSWERED)
        seen = stats(page)
        screenshot(page, f"voice-page-{transport}")
        assert seen["transport"] == transport
        assert "capital of france" in words(" ".join(transcript(page, "user")))
        assert "capital of france" in words(" ".join(transcript(page, "assistant")))
        assert page.inner_text("#status") == "Listening. Speak, or type a message."
    assert_answer_played(seen, transport, RATE)  # more than a second of the answer
    assert 0 < seen["latencies"][0]["ms"] < TURN and seen["errors"] == []


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_typed_turn_is_answered_using_the_keyboard_only(
    server: Server, microphones: dict[str, Path], playwright: Any, transport: str
) -> None:
    with chromium_page(playwright, microphones["silence"], server.url) as page:
        page.click("summary")
        page.select_option("#transport", transport)
        page.focus("#key")
        page.keyboard.type(KEY)
        page.keyboard.press("Tab")  # to the button
        page.keyboard.press("Enter")
        wait_for(page, "s.state === 'LISTENING'")
        page.focus("#message")
        page.keyboard.type(TYPED)
        page.keyboard.press("Enter")
        wait_for(page, "s.latencies.length > 0 && s.events.includes('response.done')")
        assert words(TYPED) in words(" ".join(transcript(page, "user")))
        assert words(TYPED) in words(" ".join(transcript(page, "assistant")))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_speaking_over_the_answer_stops_it_where_it_was_heard(
    server: Server, microphones: dict[str, Path], playwright: Any, transport: str
) -> None:
    with chromium_page(playwright, microphones["interruption"], server.url) as page:
        start(page, transport)
        wait_for(page, "s.state === 'LISTENING'")
        page.fill("#message", LONG)
        page.press("#message", "Enter")
        wait_for(page, "Object.keys(s.truncated).length > 0")
        # The interruption is a turn of its own: wait for its answer, then look back.
        wait_for(page, "s.events.filter(e => e === 'response.done').length >= 2 && s.state === 'LISTENING'")
        seen = stats(page)
        cut_ms = next(iter(seen["truncated"].values()))
        item = next(iter(seen["truncated"]))
        assert page.locator(f'#transcript li[data-item="{item}"]').get_attribute("class") == "assistant truncated"
        assert "stop" in words(" ".join(transcript(page, "user")))
    assert 0 < cut_ms < 30_000
    if transport == "websocket":
        # The page truncated at what its jitter buffer had played, and played nothing of that item after.
        assert abs(seen["played"][item] * 1000 / RATE - cut_ms) <= 1
    else:
        # The server cut the answer at what it had played and never played it again; what was heard
        # after the cut is what the browser's jitter buffer already held (more on a loaded machine).
        (cut,) = seen["cut"]
        assert seen["started"].count(cut) == 1
        assert all(ms < JITTER_MS for ms in seen["loudAfterCut"]), f"answer heard after the cut: {seen['loudAfterCut']}"


def test_a_wrong_key_is_refused_with_a_message_the_page_shows(
    server: Server, microphones: dict[str, Path], playwright: Any
) -> None:
    with chromium_page(playwright, microphones["silence"], server.url) as page:
        start(page, "websocket", key="sk-wrong")
        wait_for(page, "s.state === 'FAILED'", timeout=30_000)
        error = page.inner_text("#error")
        assert page.get_attribute("#error", "role") == "alert"
    assert "refused the API key" in error and "not valid" in error
    assert "sk-wrong" not in error


@contextmanager
def another_origin() -> Iterator[str]:
    """The page's files served from a second origin (another port), as a copy deployed elsewhere would be."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(PACKAGE))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_a_page_from_an_origin_not_allowed_says_how_to_allow_it_and_the_server_logs_it(
    server: Server, microphones: dict[str, Path], playwright: Any
) -> None:
    with another_origin() as origin:
        url = f"{origin}/static/index.html?server={server.url}"
        with chromium_page(playwright, microphones["silence"], url) as page:
            page.click("summary")
            page.select_option("#transport", "websocket")
            page.click("#talk")
            wait_for(page, "s.state === 'FAILED'", timeout=30_000)
            error = page.inner_text("#error")
    assert f"--allowed-origin {origin}" in error
    assert "refused a WebSocket" in server.logged() and origin in server.logged()
