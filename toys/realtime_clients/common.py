"""What every client script shares (stdlib only: each runs in its client's own venv).

A script is run as ``python toys/realtime_clients/NAME.py ARGS.json``; the JSON file names the server
(``ws_url``, ``http_url``, and ``model``, the name its pipeline answers to) and the three turns: ``text``
(a user message), ``spoken`` and
``long`` (PCM16 24 kHz files of speech, with ``*_end_s``: where their speech ends), and ``barge``
(said over the answer to ``long``, its speech starting at ``barge_start_s``). It prints JSON
lines on stdout (:func:`report`): ``{"kind": "event", "type"}`` for each server event it saw,
``{"kind": "error", "message"}`` for each error the client reported or raised (the server's ``error``
events too, for a client that leaves them to its user), and one
``{"kind": "turn", "step": "text" | "spoken" | "barge_in" | "follow_up", ...}`` per turn (the last:
the answer to what the barge-in said), ``{"kind": "client", ...}`` for what the client library
signalled itself, then ``{"kind": "end"}``.
Audio is sent as a microphone sends it (:class:`Microphone`): all along, in real time.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

RATE = 24_000
CHUNK_SAMPLES = RATE // 50  # 20 ms
ANSWER_TIMEOUT = 60.0  # seconds a turn may take to be answered
DEBUG = bool(os.environ.get("CLIENT_DEBUG"))  # each event reported whole (its deltas left out)


def settings() -> dict[str, Any]:
    """The run's settings (see the module docstring), with the PCM files read into bytes."""
    args: dict[str, Any] = json.loads(Path(sys.argv[1]).read_text())
    for name in ("spoken", "long", "barge"):
        args[name] = Path(args[name]).read_bytes()
    return args


def report(kind: str, **fields: Any) -> None:
    print(json.dumps({"kind": kind, **fields}), flush=True)


def error(message: str) -> None:
    report("error", message=message)


class Microphone:
    """A microphone: from :meth:`run` on, a 20 ms chunk once its last sample is "recorded", in real
    time, for as long as the session lasts; what :meth:`say` was given, else silence."""

    def __init__(self, append: Callable[[bytes], Awaitable[None] | None]) -> None:
        self.append = append
        self.utterances: asyncio.Queue[tuple[bytes, asyncio.Future[float]]] = asyncio.Queue()

    async def say(self, pcm: bytes) -> float:
        """Queue ``pcm`` (PCM16 24 kHz); the clock time its first sample is recorded at, once it is."""
        begun: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.utterances.put_nowait((pcm, begun))
        return await begun

    async def run(self) -> None:
        step, chunk_seconds = 2 * CHUNK_SAMPLES, CHUNK_SAMPLES / RATE
        started, sent, speaking = time.monotonic(), 0, b""
        while True:
            if not speaking and not self.utterances.empty():
                speaking, begun = self.utterances.get_nowait()
                begun.set_result(started + sent * chunk_seconds)
            chunk, speaking = speaking[:step], speaking[step:]
            sent += 1
            await asyncio.sleep(max(0.0, started + sent * chunk_seconds - time.monotonic()))
            done = self.append(chunk + bytes(step - len(chunk)))
            if done is not None:
                await done


class Turns:
    """The server's events as the client received them (JSON dicts), judged turn by turn.

    :meth:`received` is called by the client's own event hook, in order; the turns are driven
    with the client's own calls (``send_text``, ``append``) by :meth:`scenario`.
    """

    def __init__(self, *, errors_are_the_clients: bool = False) -> None:
        self.queue: asyncio.Queue[tuple[float, dict[str, Any]]] = asyncio.Queue()
        self.errors_are_the_clients = errors_are_the_clients

    def received(self, event: dict[str, Any]) -> None:
        """One server event. An ``error`` event is reported as the client's error unless the client
        library judges them itself (``errors_are_the_clients``: it reports those it does not ignore)."""
        report("event", type=event.get("type"), **({"full": event} if DEBUG and "delta" not in event else {}))
        if event.get("type") == "error":
            if self.errors_are_the_clients:
                report("server_error", error=event.get("error"))
            else:
                error(f"server error event: {event.get('error')}")
        self.queue.put_nowait((time.monotonic(), event))

    async def answer(
        self, step: str, speech_end: float | None = None, on_audio: Callable[[], None] | None = None
    ) -> dict[str, Any]:
        """Events until the next ``response.done``: what the answer said, and when its audio came
        (``first_audio_s``: after ``speech_end``, a clock time)."""
        turn: dict[str, Any] = {"step": step, "audio_bytes": 0, "transcript": "", "first_audio_s": None}
        audio_seen = False
        while True:
            at, event = await self.queue.get()
            match event.get("type"):
                case "input_audio_buffer.speech_started" if audio_seen:
                    turn.setdefault("audio_deltas_after_speech_started", 0)
                case "response.output_audio.delta":
                    if not audio_seen:
                        audio_seen = True
                        turn["first_audio_s"] = None if speech_end is None else at - speech_end
                        if on_audio is not None:
                            on_audio()
                    turn["audio_bytes"] += len(base64.b64decode(event["delta"]))
                    if "audio_deltas_after_speech_started" in turn:
                        turn["audio_deltas_after_speech_started"] += 1
                case "response.output_audio_transcript.done":
                    turn["transcript"] += event["transcript"]
                case "response.done":
                    response = event["response"]
                    turn.update(status=response["status"], done_at=at)
                    turn["reason"] = (response.get("status_details") or {}).get("reason")
                    return turn

    async def scenario(
        self,
        args: dict[str, Any],
        send_text: Callable[[str], Awaitable[None]],
        append: Callable[[bytes], Awaitable[None] | None],
    ) -> None:
        """The text turn, the spoken turn, the barge-in over a spoken answer and the answer to the barge-in,
        with the client's microphone (``append``) streaming from the start."""
        microphone = Microphone(append)
        listening = asyncio.ensure_future(microphone.run())
        try:
            await send_text(args["text"])
            report("turn", **await self.next_answer("text"))

            started = await microphone.say(args["spoken"])
            report("turn", **await self.next_answer("spoken", started + args["spoken_end_s"]))

            barge: list[asyncio.Future[float]] = []
            started = await microphone.say(args["long"])

            def speak_over() -> None:
                barge.append(asyncio.ensure_future(microphone.say(args["barge"])))

            turn = await self.next_answer("barge_in", started + args["long_end_s"], on_audio=speak_over)
            if barge and barge[0].done():
                turn["to_cancelled_s"] = turn["done_at"] - (barge[0].result() + args["barge_start_s"])
            report("turn", **turn)
            report("turn", **await self.next_answer("follow_up"))
        finally:
            listening.cancel()

    async def next_answer(self, step: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return await asyncio.wait_for(self.answer(step, *args, **kwargs), ANSWER_TIMEOUT)


def run(main: Callable[[dict[str, Any]], Awaitable[None]], timeout: float = 120) -> None:
    """Run ``main(settings())`` on asyncio; an exception is reported as an error, then ``end``."""

    async def bounded() -> None:
        await asyncio.wait_for(main(settings()), timeout)

    try:
        asyncio.run(bounded())
    except BaseException as exc:  # the test reads what broke the client from the report
        error(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}")
    report("end")
