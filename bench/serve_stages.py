"""A chat stage that streams its answer word by word, for the serving benchmark."""

from __future__ import annotations

from omnitrio.contract import IncomingMessage, OutgoingMessage, StagePayload
from toys.hand_scheduler import HandScheduler


class WordStreamer(HandScheduler):
    """Answers a chat with ``words`` text deltas, then ``{"text": answer}``."""

    def __init__(self, words: int = 10) -> None:
        super().__init__()
        self.words = words

    def on_request(self, msg: IncomingMessage) -> None:
        deltas = [f"word{i} " for i in range(self.words)]
        for delta in deltas:
            self.outbox.put(OutgoingMessage(msg.request_id, "stream", data=delta, metadata={"modality": "text"}))
        payload: StagePayload = msg.data
        payload.data = {"text": "".join(deltas)}
        self.outbox.put(OutgoingMessage(msg.request_id, "result", data=payload))


def create_word_streamer(words: int = 10) -> WordStreamer:
    return WordStreamer(words)
