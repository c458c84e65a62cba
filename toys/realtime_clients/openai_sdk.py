"""The official ``openai`` SDK's async realtime client (``client.realtime.connect``) through the turns of
:mod:`common`; every server event is parsed by the SDK (``async for event in connection``)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import openai
from common import Turns, run


async def main(args: dict[str, Any]) -> None:
    client = openai.AsyncOpenAI(base_url=args["http_url"] + "/v1", api_key="unused")
    turns = Turns()
    async with client.realtime.connect(model=args["model"]) as connection:

        async def read() -> None:
            async for event in connection:
                turns.received(event.model_dump(mode="json", exclude_unset=True))

        async def send_text(text: str) -> None:
            content = [{"type": "input_text", "text": text}]
            await connection.conversation.item.create(item={"type": "message", "role": "user", "content": content})
            await connection.response.create()

        async def append(chunk: bytes) -> None:
            await connection.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())

        reader = asyncio.ensure_future(read())
        try:
            await turns.scenario(args, send_text, append)
        finally:
            reader.cancel()


if __name__ == "__main__":
    run(main)
