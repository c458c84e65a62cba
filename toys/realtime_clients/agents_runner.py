"""openai-agents' ``RealtimeRunner`` (a ``RealtimeAgent`` session) through the turns of :mod:`common`.

The server's events are read from the session's ``raw_model_event``s (the SDK validates each
against its event union first: one it cannot parse becomes an ``error`` or ``exception``, reported).
"""

from __future__ import annotations

import asyncio
from typing import Any

from agents.realtime import RealtimeAgent, RealtimeRunner
from common import Turns, error, report, run


async def main(args: dict[str, Any]) -> None:
    agent = RealtimeAgent(name="assistant", instructions="Answer briefly.")
    runner = RealtimeRunner(agent, config={"model_settings": {"model_name": args["model"]}})
    turns = Turns(errors_are_the_clients=True)
    session = await runner.run(model_config={"url": args["ws_url"] + "?model=" + args["model"], "api_key": "unused"})
    async with session:

        async def read() -> None:
            async for event in session:
                match event.type:
                    case "raw_model_event" if event.data.type == "raw_server_event":
                        turns.received(event.data.data)
                    case "raw_model_event" if event.data.type == "exception":
                        error(f"agents exception: {event.data.exception!r} ({event.data.context})")
                    case "error":
                        error(f"agents error: {event.error!r}")
                    case "audio_interrupted":
                        report("client", signal="audio_interrupted")

        async def append(chunk: bytes) -> None:
            await session.send_audio(chunk)

        reader = asyncio.ensure_future(read())
        try:
            await turns.scenario(args, session.send_message, append)
        finally:
            reader.cancel()


if __name__ == "__main__":
    run(main)
