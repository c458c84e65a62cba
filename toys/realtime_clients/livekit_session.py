"""livekit-plugins-openai's ``RealtimeModel(base_url=...).session()`` through the turns of :mod:`common`.

Used as livekit's ``AgentSession`` uses it: text goes in through ``update_chat_ctx`` then
``generate_reply()``, the microphone through ``push_audio``, every generation's streams are
played (drained), and user speech over an answer calls ``interrupt()``. The server's events come
from the session's ``openai_server_event_received``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from common import RATE, Turns, error, report, run
from livekit import rtc
from livekit.agents import llm
from livekit.plugins import openai


async def play(generation: llm.GenerationCreatedEvent) -> None:
    async def drain(stream: Any) -> None:
        async for _ in stream:
            pass

    async for message in generation.message_stream:
        await asyncio.gather(drain(message.audio_stream), drain(message.text_stream))


async def main(args: dict[str, Any]) -> None:
    turns = Turns(errors_are_the_clients=True)
    players: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession() as http:
        model = openai.realtime.RealtimeModel(
            base_url=args["http_url"] + "/v1", api_key="unused", model=args["model"], http_session=http
        )
        session = model.session()
        session.on("openai_server_event_received", turns.received)
        session.on("error", lambda failure: error(f"livekit error: {failure.error!r}"))
        session.on("generation_created", lambda generation: players.add(asyncio.ensure_future(play(generation))))

        def barge_in(_: Any) -> None:
            report("client", signal="input_speech_started", active=session.has_active_generation)
            session.interrupt()

        session.on("input_speech_started", barge_in)

        async def send_text(text: str) -> None:
            chat = session.chat_ctx.copy()
            chat.add_message(role="user", content=text)
            await session.update_chat_ctx(chat)
            await session.generate_reply()

        def append(chunk: bytes) -> None:
            samples = len(chunk) // 2
            session.push_audio(rtc.AudioFrame(chunk, RATE, 1, samples))

        try:
            await turns.scenario(args, send_text, append)
        finally:
            await session.aclose()
            await model.aclose()
            for player in players:
                player.cancel()


if __name__ == "__main__":
    run(main)
