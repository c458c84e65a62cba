"""A chat stage that streams its answer word by word, for the serving benchmark."""

from __future__ import annotations

import queue

from omnitrio.contract import IncomingMessage, OutgoingMessage, StagePayload


class WordStreamer:
    """Answers a chat with ``words`` text deltas, then ``{"text": answer}``."""

    def __init__(self, words: int = 10) -> None:
        self.inbox: queue.Queue[IncomingMessage | None] = queue.Queue()
        self.outbox: queue.Queue[OutgoingMessage] = queue.Queue()
        self.words = words

    def warm_up_serving_thread(self) -> None:
        return

    def start(self) -> None:
        while (msg := self.inbox.get()) is not None:
            if msg.type != "new_request":
                continue
            deltas = [f"word{i} " for i in range(self.words)]
            for delta in deltas:
                self.outbox.put(OutgoingMessage(msg.request_id, "stream", data=delta, metadata={"modality": "text"}))
            payload: StagePayload = msg.data
            payload.data = {"text": "".join(deltas)}
            self.outbox.put(OutgoingMessage(msg.request_id, "result", data=payload))

    def stop(self) -> None:
        self.inbox.put(None)

    def abort(self, request_id: str) -> None:
        return


def create_word_streamer(words: int = 10) -> WordStreamer:
    return WordStreamer(words)
