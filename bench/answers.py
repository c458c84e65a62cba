"""Would a voice user accept the answers?  ~30 everyday questions and follow-ups, checked per model.

Each item is a short conversation: one question, or a statement and a follow-up that needs it.
The responder stage answers it as the voice loop does (spoken: sentences streamed to TTS, the
voice system prompt, the configured sampling defaults), each turn fed the previous answers.  An
answer is *acceptable* when it is not empty, did not run to the token cap (``finish_reason`` is
``"stop"``: a loop the repetition guard cut counts as stopped, so the bench also counts how many
answers the guard cut), and contains the expected keyword where the item has one.  The bench prints
the share acceptable per model and writes ``bench/results/answers.json``.

Run: ``.venv/bin/python bench/answers.py [--model FILE.gguf ...] [--set key=value ...]``, where
``--set`` overrides a responder factory argument (``frequency_penalty=0.3``).  Not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from omnitrio.contract import IncomingMessage, OmniRequest, StagePayload  # noqa: E402
from schedulers.speech.stages import create_responder_stage  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "answers.json"
# (turns, keyword the last answer must contain, case-insensitive; None: any non-looping answer)
ITEMS: list[tuple[list[str], str | None]] = [
    (["What is the capital of France?"], "Paris"),
    (["What is the capital of Japan?"], "Tokyo"),
    (["How many legs does a spider have?"], "8|eight"),
    (["How many days are in a week?"], "7|seven"),
    (["What is 12 plus 30?"], "42"),
    (["What color is the sky on a clear day?"], "blue"),
    (["What do bees make?"], "honey"),
    (["Which planet do we live on?"], "Earth"),
    (["What is the opposite of hot?"], "cold"),
    (["What language is spoken in Spain?"], "Spanish"),
    (["What's a good name for a pet cat?"], None),
    (["Give me a sleep tip."], None),
    (["Tell me a fun fact."], None),
    (["How do I boil an egg?"], None),
    (["Suggest a quick healthy breakfast."], None),
    (["What should I do if I can't sleep?"], None),
    (["Tell me a short joke."], None),
    (["How can I stay focused while working?"], None),
    (["What's a good way to start learning to cook?"], None),
    (["Recommend a hobby I can do at home."], None),
    (["Write a haiku about the sea."], None),
    (["Why is the sky blue?"], None),
    (["What is a noun?"], None),
    (["How do I make a cup of tea?"], None),
    (["My name is Alice.", "What is my name?"], "Alice"),
    (["I live in Paris.", "Which city do I live in?"], "Paris"),
    (["I have two cats and a dog.", "How many cats do I have?"], "2|two"),
    (["What is the capital of France?", "And what about Germany?"], "Berlin"),
    (["My favourite colour is green.", "What is my favourite colour?"], "green"),
    (["Tell me about dogs.", "Now say that in one sentence."], None),
]


class Asker:
    """Answers conversations with one responder stage, spoken (the voice loop's settings)."""

    def __init__(self, responder: Any) -> None:
        self.responder = responder
        self.count = 0

    def answer(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        self.count += 1
        rid = f"q{self.count}"
        inputs = {"task": "chat", "messages": messages, "modalities": ["text", "audio"]}
        payload = StagePayload(rid, OmniRequest(inputs, params={"stream": True}), {"raw_inputs": inputs})
        self.responder.inbox.put(IncomingMessage(rid, "new_request", payload))
        while True:
            out = self.responder.outbox.get(timeout=600)
            if out.type == "result":
                return dict(out.data.data)
            if out.type == "error":
                raise out.data


def judge(answer: dict[str, Any], keyword: str | None, cap: int) -> dict[str, Any]:
    text = answer["text"].strip()
    looped = answer["finish_reason"] != "stop" or answer["usage"]["completion_tokens"] >= cap
    keyed = keyword is None or any(k.lower() in text.lower() for k in keyword.split("|"))
    return {"acceptable": bool(text) and not looped and keyed, "empty": not text, "looped": looped, "keyword": keyed}


@contextlib.contextmanager
def running(scheduler: Any) -> Iterator[None]:
    """``scheduler.start()`` in a thread of its own, stopped and joined on exit."""
    thread = threading.Thread(target=scheduler.start, name="responder", daemon=True)
    thread.start()
    try:
        yield
    finally:
        scheduler.stop()
        thread.join()


def run_model(model: str | None, settings: dict[str, Any]) -> dict[str, Any]:
    responder = create_responder_stage(model_path=model, **settings)
    cap = int(settings.get("max_tokens", 256))
    asker = Asker(responder)
    rows = []
    started = time.perf_counter()
    with running(responder):
        for turns, keyword in ITEMS:
            messages: list[dict[str, str]] = []
            answer: dict[str, Any] = {}
            for turn in turns:
                messages.append({"role": "user", "content": turn})
                answer = asker.answer(messages)
                messages.append({"role": "assistant", "content": answer["text"]})
            verdict = judge(answer, keyword, cap)
            rows.append({"turns": turns, "answer": answer["text"], "tokens": answer["usage"]["completion_tokens"],
                         **verdict})  # fmt: skip
            print(("ok  " if verdict["acceptable"] else "BAD ") + " / ".join(turns), "->", repr(answer["text"][:120]))
    share = sum(r["acceptable"] for r in rows) / len(rows)
    return {
        "model": model or "SmolLM2-135M-Instruct (default)",
        "settings": settings,
        "acceptable_share": round(share, 3),
        "looped": sum(r["looped"] for r in rows),
        "empty": sum(r["empty"] for r in rows),
        "keyword_missed": sum(not r["keyword"] for r in rows),
        "seconds": round(time.perf_counter() - started, 1),
        "rows": rows,
    }


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="*", default=[None], help="GGUF files (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a responder factory argument")
    args = parser.parse_args()
    settings = {key: _value(text) for key, text in (item.split("=", 1) for item in args.set)}
    results: dict[str, Any] = {"load_avg_before": round(os.getloadavg()[0], 2), "models": []}
    for model in args.model:
        row = run_model(model, settings)
        results["models"].append(row)
        print(f"{row['model']}: {row['acceptable_share']:.0%} acceptable ({row['looped']} looped, "
              f"{row['empty']} empty, {row['keyword_missed']} missed the keyword) in {row['seconds']} s")  # fmt: skip
    results["load_avg_after"] = round(os.getloadavg()[0], 2)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
