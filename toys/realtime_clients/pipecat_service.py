"""pipecat-ai's ``OpenAIRealtimeLLMService`` (``pipecat.services.openai.realtime.llm``) in a pipeline,
through the turns of :mod:`common`.

The pipeline is what a transport would feed: the first text turn is the service's initial
``LLMContextFrame``, the microphone is ``InputAudioRawFrame``s; frames out of the service are
recorded (an ``ErrorFrame`` is reported). The service parses the server's events itself
(``events.parse_server_event``, which raises on an event it knows but cannot validate); they are
seen by wrapping that function.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from common import RATE, Turns, error, run
from pipecat.frames.frames import ErrorFrame, Frame, InputAudioRawFrame, LLMContextFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime import events
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner


class Errors(FrameProcessor):
    """Passes every frame on; reports the ``ErrorFrame``s."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, ErrorFrame):
            error(f"pipecat error frame: {frame.error}")
        await self.push_frame(frame, direction)


async def main(args: dict[str, Any]) -> None:
    turns = Turns(errors_are_the_clients=True)
    parse = events.parse_server_event

    def parse_and_see(message: str) -> Any:
        turns.received(json.loads(message))
        return parse(message)

    events.parse_server_event = parse_and_see
    service = OpenAIRealtimeLLMService(api_key="unused", base_url=args["ws_url"])  # its default model
    pipeline = Pipeline([Errors(), service, Errors()])
    params = PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE)
    worker = PipelineWorker(pipeline, params=params, idle_timeout_secs=None, enable_rtvi=False)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.ensure_future(runner.run())

    async def send_text(text: str) -> None:
        await worker.queue_frame(LLMContextFrame(LLMContext(messages=[{"role": "user", "content": text}])))

    async def append(chunk: bytes) -> None:
        await worker.queue_frame(InputAudioRawFrame(audio=chunk, sample_rate=RATE, num_channels=1))

    try:
        await turns.scenario(args, send_text, append)
    finally:
        await worker.cancel()
        await running


if __name__ == "__main__":
    run(main)
