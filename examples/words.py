"""Split a text, upper-case it and count its words in another process, join the two, stream the answer.

Run it from the repository root: ``python -m examples.words`` (``--inline`` keeps every stage in
this process). Factory, compute, projection and merge functions are plain module-level functions
named by import path, so the stage processes import this module on their own.
"""

from __future__ import annotations

import sys
import time

import trio

from omnitrio import (
    CompleteMessage,
    FactoryArgs,
    OutgoingMessage,
    PipelineConfig,
    StageConfig,
    StagePayload,
    StreamMessage,
    open_pipeline,
)
from schedulers.simple import SimpleScheduler

CONFIG = PipelineConfig(
    name="words",
    stages=[
        StageConfig(
            name="split",
            process="p1",
            factory_path="examples.words.create_split",
            next=["upper", "count"],
            project_payload={"upper": "examples.words.only_text", "count": "examples.words.only_words"},
        ),
        StageConfig(name="upper", process="p2", factory_path="examples.words.create_upper", next="join"),
        StageConfig(name="count", process="p2", factory_path="examples.words.create_count", next="join"),
        StageConfig(
            name="join",
            factory_path="examples.words.create_join",
            factory=FactoryArgs(pause_s=0.01),
            terminal=True,
            wait_for=["upper", "count"],
            merge_fn="examples.words.merge",
        ),
    ],
)


def split(payload: StagePayload) -> StagePayload:
    """A compute function: the entry stage gets ``{"raw_inputs": <what was submitted>}``."""
    text = payload.data["raw_inputs"]
    payload.data = {"text": text, "words": text.split()}
    return payload


def create_split() -> SimpleScheduler:
    """A factory: called once in the stage's process; returns the stage's scheduler."""
    return SimpleScheduler(split)


def only_text(payload: StagePayload) -> StagePayload:
    """A projection: what ``upper`` receives (a new payload, sharing nothing mutable)."""
    return StagePayload(payload.request_id, payload.request, {"text": payload.data["text"]})


def only_words(payload: StagePayload) -> StagePayload:
    return StagePayload(payload.request_id, payload.request, {"words": list(payload.data["words"])})


def upper(payload: StagePayload) -> StagePayload:
    payload.data = {"text": payload.data["text"].upper()}
    return payload


def create_upper() -> SimpleScheduler:
    return SimpleScheduler(upper)


def count(payload: StagePayload) -> StagePayload:
    payload.data = {"count": len(payload.data["words"])}
    return payload


def create_count() -> SimpleScheduler:
    return SimpleScheduler(count)


def merge(inputs: dict[str, StagePayload]) -> StagePayload:
    """A merge function: one payload from each stage of ``wait_for``, by stage name."""
    text, n = inputs["upper"].data["text"], inputs["count"].data["count"]
    return StagePayload(inputs["upper"].request_id, inputs["upper"].request, {"text": text, "count": n})


class Join(SimpleScheduler):
    """The terminal stage: streams the answer to the caller word by word, then returns it whole."""

    def __init__(self, pause_s: float) -> None:
        super().__init__(self.answer)
        self.pause_s = pause_s

    def answer(self, payload: StagePayload) -> StagePayload:
        for word in payload.data["text"].split():
            self.outbox.put(
                OutgoingMessage(payload.request_id, "stream", data=f"{word} ", metadata={"modality": "text"})
            )
            time.sleep(self.pause_s)  # a model would be computing the next word here
        return payload


def create_join(pause_s: float = 0.0) -> Join:
    return Join(pause_s)


async def main(inline: bool = False) -> None:
    async with open_pipeline(CONFIG, inline=inline) as pipeline:  # starts the processes; stops them on exit
        print(await pipeline.submit("r1", "hello omni world"))
        async with pipeline.stream("r2", "say something nice", timeout=5) as stream:
            async for message in stream:  # StreamMessage ... then CompleteMessage
                match message:
                    case StreamMessage(chunk=word):
                        print(word, end="", flush=True)
                    case CompleteMessage(result=result):
                        print(f"| {result}")
        await pipeline.abort("r3", wait=True)  # an id that is not running: returns at once
        print(sorted((await pipeline.health())["stages"]))


if __name__ == "__main__":
    trio.run(main, "--inline" in sys.argv[1:])
