"""What Qwen3-Omni's stage-to-stage chunks cost on the wire: the typed handoffs against the dicts they replaced.

Two measures, each comparing the same content as the dict the stages sent before
``schedulers.qwen3_omni.handoffs`` and as the handoff they send now:

* **pack**: the relay's part of a hop, in one process: ``ShmPool.pack`` of ``(chunk, metadata)`` (as the
  switchboard packs a stream chunk for another process), ``ShmReader.unpack``, leases released, in
  microseconds per chunk, for the per-token and per-frame edges (thinker → decode, thinker → talker,
  talker → code2wav) and the talker's prompt chunk;
* **hop**: a whole hop through the runtime, two stages in two processes: the first streams ``count``
  chunks per request, the second reads each chunk's token id; chunks per second at ``concurrency``
  requests at once, for the per-token edges.

The two forms alternate in every round, so a loaded machine slows both alike; each figure is the median
over rounds, and ``typed_over_dict`` the ratio (pack: time, below 1 is cheaper; hop: rate, above 1 is
faster).

Run: ``python -m bench.handoff_wire [--quick] [--rounds N]``; writes ``bench/results/handoff_wire.json``.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import torch
import trio

from bench.measure import loadavg
from omnitrio import PipelineConfig, StageConfig, open_pipeline
from omnitrio.contract import IncomingMessage, OutgoingMessage, StagePayload, StreamItem, put_messages
from omnitrio.transport.relay import ShmPool, ShmReader
from schedulers.engine.handoffs import DecodeToken
from schedulers.qwen3_omni.handoffs import Codes, TalkerPrompt, TalkerToken
from schedulers.streaming import StreamingSimpleScheduler

RESULTS = Path(__file__).parent / "results"
PROMPT_LEN, QUANTIZERS = 200, 16
HOP_EDGES = ("thinker->decode token", "thinker->talker token")
Forms = dict[str, tuple[Any, str]]


def chunk_forms(hidden: int) -> dict[str, Forms]:
    """Per edge: its chunk as the dict it was and as the handoff it is, each with its metadata modality."""
    ids = torch.arange(PROMPT_LEN)
    embeds, states = torch.randn(PROMPT_LEN, hidden), torch.randn(PROMPT_LEN, hidden)
    embed = torch.randn(1, hidden)
    codes = torch.randint(0, 2048, (QUANTIZERS, 1))
    prompt = {"kind": "prompt", "token_ids": ids, "embeds": embeds, "hidden": states, "speaker": "ethan"}
    prompt |= {"talker": None, "want_audio": True, "image_grid_thw": None, "audio_feature_lengths": None}
    return {
        "thinker->decode token": {
            "dict": ({"kind": "token", "token_ids": [151], "want_audio": True}, "tokens"),
            "typed": (DecodeToken(151, True), "tokens"),
        },
        "thinker->talker token": {
            "dict": ({"kind": "token", "token_ids": torch.tensor([151]), "embeds": embed}, "thinker"),
            "typed": (TalkerToken(151, embed), "thinker"),
        },
        "talker->code2wav codes": {"dict": ({"codes": codes}, "codes"), "typed": (Codes(codes), "codes")},
        "thinker->talker prompt": {
            "dict": (prompt, "thinker"),
            "typed": (TalkerPrompt(ids, embeds, states, speaker="ethan"), "thinker"),
        },
    }


def alternating(round_index: int) -> list[str]:
    return ["dict", "typed"] if round_index % 2 == 0 else ["typed", "dict"]


def ratios(samples: dict[str, dict[str, list[float]]], unit: str, digits: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for edge, timed in samples.items():
        old, new = statistics.median(timed["dict"]), statistics.median(timed["typed"])
        figures[edge] = {
            f"dict_{unit}": round(old, digits),
            f"typed_{unit}": round(new, digits),
            "typed_over_dict": round(new / old, 3),
        }
    return figures


# -- pack: the relay alone ----------------------------------------------------------------------------


def per_chunk_us(pool: ShmPool, reader: ShmReader, chunk: Any, modality: str, count: int) -> float:
    """Microseconds per pack + unpack + release of ``chunk``."""
    metadata = {"modality": modality}
    start = time.perf_counter()
    for _ in range(count):
        packed = pool.pack((chunk, metadata))
        reader.unpack(packed.header)
        pool.release(packed.leases)
    return (time.perf_counter() - start) / count * 1e6


def pack(rounds: int, count: int, hidden: int) -> dict[str, Any]:
    table = chunk_forms(hidden)
    samples: dict[str, dict[str, list[float]]] = {edge: {"dict": [], "typed": []} for edge in table}
    with ShmPool(f"omnitrio-bench-handoff-{uuid.uuid4().hex[:8]}-") as pool, ShmReader() as reader:
        for round_index in range(rounds):
            for edge, forms in table.items():
                n = max(count // 50, 20) if edge.endswith("prompt") else count
                for form in alternating(round_index):
                    chunk, modality = forms[form]
                    samples[edge][form].append(per_chunk_us(pool, reader, chunk, modality, n))
    return ratios(samples, "us", 2)


# -- hop: through the runtime, process to process ------------------------------------------------------


class Emitter:
    """The sending stage: a request whose inputs are ``{"form", "edge", "count"}`` streams ``count`` chunks
    of that form to the next stage at once (the runtime's credits pace them), then its result."""

    def __init__(self, hidden: int) -> None:
        self.inbox: queue.Queue[IncomingMessage | None] = queue.Queue()
        self.outbox: queue.Queue[OutgoingMessage] = queue.Queue()
        self.chunks = chunk_forms(hidden)

    def warm_up_serving_thread(self) -> None:
        torch.set_num_threads(1)

    def start(self) -> None:
        while (message := self.inbox.get()) is not None:
            if message.type != "new_request":
                continue
            payload: StagePayload = message.data
            asked = payload.data["raw_inputs"]
            chunk, modality = self.chunks[asked["edge"]][asked["form"]]
            rid = message.request_id
            out = [OutgoingMessage(rid, "stream", chunk, metadata={"modality": modality})] * asked["count"]
            payload.data = {"count": asked["count"]}
            put_messages(self.outbox, [*out, OutgoingMessage(rid, "result", payload)])

    def stop(self) -> None:
        self.inbox.put(None)

    def abort(self, request_id: str) -> None:
        return


class Receiver(StreamingSimpleScheduler):
    """The receiving stage: reads each chunk's token id, as decode and the talker do; answers the count."""

    def __init__(self) -> None:
        super().__init__(compute_fn=lambda payload: payload)
        self.seen: dict[str, int] = {}

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        return True

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        data = item.data
        token = data["token_ids"][0] if isinstance(data, dict) else data.token_id
        self.seen[request_id] = self.seen.get(request_id, 0) + (token is not None)
        return []

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage]:
        payload = self.stream_payloads[request_id]
        payload.data = {"received": self.seen.pop(request_id, 0)}
        return [OutgoingMessage(request_id, "result", data=payload)]

    def clear_stream_state(self, request_id: str) -> None:
        self.seen.pop(request_id, None)


def create_emitter(hidden: int = 2048) -> Emitter:
    return Emitter(hidden)


def create_receiver() -> Receiver:
    return Receiver()


def hop_config(hidden: int) -> PipelineConfig:
    emitter = StageConfig(
        name="emitter",
        process="p_emitter",
        factory_path="bench.handoff_wire.create_emitter",
        factory={"hidden": hidden},
        next="receiver",
        stream_to=["receiver"],
    )
    receiver = StageConfig(
        name="receiver",
        process="p_receiver",
        factory_path="bench.handoff_wire.create_receiver",
        terminal=True,
        can_accept_stream_before_payload=True,
    )
    return PipelineConfig(name="handoff-hop", stages=[emitter, receiver])


async def hop(rounds: int, count: int, concurrency: int, hidden: int) -> dict[str, Any]:
    samples: dict[str, dict[str, list[float]]] = {edge: {"dict": [], "typed": []} for edge in HOP_EDGES}
    serial = 0
    async with open_pipeline(hop_config(hidden)) as pipeline:

        async def one(form: str, edge: str, n: int) -> None:
            nonlocal serial
            serial += 1
            result = await pipeline.submit(f"{form}-{serial}", {"form": form, "edge": edge, "count": n})
            assert result == {"received": n}, result

        async def burst(form: str, edge: str, n: int) -> float:
            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(concurrency):
                    nursery.start_soon(one, form, edge, n)
            return n * concurrency / (time.perf_counter() - start)

        for edge in HOP_EDGES:
            for form in ("dict", "typed"):
                await burst(form, edge, 20)  # both ends have met this form once
        for round_index in range(rounds):
            for edge in HOP_EDGES:
                for form in alternating(round_index):
                    samples[edge][form].append(await burst(form, edge, count))
    return ratios(samples, "chunks_per_s", 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run that checks the bench works")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--hidden", type=int, default=2048, help="the thinker's hidden size (Qwen3-Omni: 2048)")
    args = parser.parse_args()
    pack_count, hop_count, hop_rounds = (200, 50, 2) if args.quick else (2000, 400, args.rounds)
    rounds = 3 if args.quick else args.rounds
    torch.set_num_threads(1)
    load_before = loadavg()
    result: dict[str, Any] = {
        "what": "typed handoffs against the dicts they replaced: relay pack+unpack per chunk, and chunks/s "
        "through a two-process hop (medians over interleaved rounds)",
        "rounds": rounds,
        "hidden": args.hidden,
        "loadavg_before": load_before,
        "pack": pack(rounds, pack_count, args.hidden),
    }
    for concurrency in (1, 8):
        result[f"hop_c{concurrency}"] = trio.run(hop, hop_rounds, hop_count, concurrency, args.hidden)
    result["loadavg_after"] = loadavg()
    for name, row in result["pack"].items():
        print(f"pack {name:24s} dict {row['dict_us']:8.2f} us  typed {row['typed_us']:8.2f} us  "
              f"typed/dict {row['typed_over_dict']:.3f}")  # fmt: skip
    for concurrency in (1, 8):
        for name, row in result[f"hop_c{concurrency}"].items():
            print(f"hop c={concurrency} {name:22s} dict {row['dict_chunks_per_s']:8.0f}/s  "
                  f"typed {row['typed_chunks_per_s']:8.0f}/s  typed/dict {row['typed_over_dict']:.3f}")  # fmt: skip
    print(f"load before {load_before}, after {result['loadavg_after']}")
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "handoff_wire.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
