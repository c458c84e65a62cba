"""Driving the voice page in a real browser: Debian's chromium under Playwright, a WAV file as its microphone.

Used by the page's tests and by ``bench/browser_turn.py``. Nothing is downloaded but Debian's
``chromium`` package (:func:`ensure_chromium` installs it with apt when it is missing); Playwright
drives that binary (``executable_path``), never a browser of its own: :func:`launch_chromium` starts it
with :func:`launch_args`, :func:`chromium_page` opens one page in it for a block.

:func:`served` starts ``python -m omnitrio serve`` on a free loopback port as a user does and
keeps its log in a file; :func:`speech_wav` has the server's own TTS (Piper) say a sentence into
a WAV that the browser then hears as its microphone, from the moment the page opens it, once.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import tempfile
import time
import wave
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx

from toys.debian import ensure

CHROMIUM = Path("/usr/bin/chromium")
RATE = 24_000
ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 120.0


def launch_args(microphone: Path) -> list[str]:
    """Chromium's flags: headless, quiet, no prompts, and ``microphone`` (a WAV) played once as the mic."""
    return [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={microphone}%noloop",
        "--autoplay-policy=no-user-gesture-required",
    ]


def launch_chromium(playwright: Any, microphone: Path) -> Any:
    """Debian's chromium under ``playwright`` (its sync API), with :func:`launch_args`; the caller closes it."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=launch_args(microphone))


@contextlib.contextmanager
def chromium_page(playwright: Any, microphone: Path, url: str) -> Iterator[Any]:
    """The page at ``url`` in a fresh chromium whose microphone plays ``microphone`` once; closed after the block."""
    browser = launch_chromium(playwright, microphone)
    try:
        page = browser.new_page()
        page.goto(url)
        yield page
    finally:
        browser.close()


def ensure_chromium() -> str | None:
    """Install Debian's chromium when it is missing; None when it is there, else why it is not."""
    return ensure("chromium", str(CHROMIUM))


@attrs.frozen
class Server:
    """A running ``python -m omnitrio serve``."""

    url: str
    log: Path

    def logged(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def served(
    args: Sequence[str] = (), *, env: dict[str, str] | None = None, timeout: float = START_TIMEOUT
) -> Iterator[Server]:
    """``python -m omnitrio serve --port 0 ARGS`` until the block ends (``timeout``: seconds it has to
    start); then SIGINT, as a user stops it."""
    with tempfile.TemporaryDirectory(prefix="omnitrio-page-") as folder:
        log_path = Path(folder) / "server.log"
        with open(log_path, "w") as log:
            command = [sys.executable, "-m", "omnitrio", "serve", "--port", "0", *args]
            process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + timeout
            while (found := re.search(r"serving .* on (http://127\.0\.0\.1:\d+)", log_path.read_text())) is None:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not start:\n{log_path.read_text()[-2000:]}")
                time.sleep(0.2)
            yield Server(found.group(1), log_path)
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.contextmanager
def page_server(key: str) -> Iterator[Server | str]:
    """A server for the page's tests (API key ``key``, the repeat responder), or why there can be none.

    Yields the reason (a string) when chromium cannot be had, so a test skips saying why.
    """
    reason = ensure_chromium()
    if reason is not None:
        yield reason
        return
    with served(["--api-key", key, "--set", "responder.factory.mode=repeat"]) as running:
        yield running


def speech_wav(server: Server, path: Path, parts: Sequence[str | float], *, key: str | None = None) -> Path:
    """A mono 24 kHz WAV of ``parts``: each string said by the server's voice, each number that many
    seconds of silence."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    model = httpx.get(f"{server.url}/voice.json", timeout=30).json()["model"]
    pcm = bytearray()
    for part in parts:
        if isinstance(part, str):
            body: dict[str, Any] = {"model": model, "input": part, "voice": "default", "response_format": "pcm"}
            answer = httpx.post(f"{server.url}/v1/audio/speech", json=body, headers=headers, timeout=120)
            answer.raise_for_status()
            pcm += answer.content
        else:
            pcm += bytes(2 * int(part * RATE))
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(bytes(pcm))
    return path
