"""Process groups over TCP against the local path: per-hop latency and 128 MB tensor GB/s.

* ``hop``: a two-stage chain (caller → s0 → s1 → caller, three hops), small requests one
  at a time, each stage in its own process group: ``placement = "ray"`` (Ray actors,
  zmq over TCP on loopback) against ``"local"`` (child processes, Unix sockets).  Reports
  request p50/p99 and p50 / 3 as the per-hop figure.
* ``tensor``: one 128 MB float32 tensor sent from one switchboard to another over TCP,
  in one process: to a peer on another host (127.0.0.2, so in the TCP frames) and to a
  peer on this host (shared memory, only the header over TCP).  Median GB/s of
  ``--repeats`` sends after one warm-up.

Run: ``python bench/ray_tcp.py [--requests 200] [--repeats 5] [--only tensor|hop] [--out FILE]``
(``hop`` needs the ``ray`` extra; it starts a loopback-only local cluster).  Writes
``bench/results/ray_tcp.json`` (or ``--out``).  Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.measure import MIB, latency_ms, loadavg  # noqa: E402
from omnitrio import PipelineConfig, StageConfig, open_pipeline  # noqa: E402
from omnitrio.envelopes import Payload, ToStage  # noqa: E402
from omnitrio.placement.cluster import ray_cluster  # noqa: E402
from omnitrio.switchboard import Lease, Switchboard  # noqa: E402

TENSOR_BYTES = 128 * MIB


def chain(placement: str) -> PipelineConfig:
    echo = "toys.stages.create_echo"
    return PipelineConfig(
        name=f"hop-{placement}",
        placement=placement,  # type: ignore[arg-type]
        stages=[
            StageConfig(name="s0", process="p0", factory_path=echo, next="s1"),
            StageConfig(name="s1", process="p1", factory_path=echo, terminal=True),
        ],
    )


async def hop(placement: str, requests: int) -> dict[str, Any]:
    async with open_pipeline(chain(placement)) as pipeline:
        for i in range(10):
            await pipeline.submit(f"warm{i}", "x")
        samples = []
        for i in range(requests):
            start = time.perf_counter()
            await pipeline.submit(f"r{i}", "x")
            samples.append(time.perf_counter() - start)
    figures = latency_ms(samples)
    figures["per_hop_p50_ms"] = figures["p50_ms"] / 3
    return figures


class _Sink:
    def __init__(self) -> None:
        self.send, self.received = trio.open_memory_channel[Any](10)

    def deliver(self, envelope: ToStage, leases: Sequence[Lease] = ()) -> None:
        assert isinstance(envelope, Payload)
        self.send.send_nowait((envelope.body, leases))

    def holds(self, request_id: str, inc: int) -> bool:
        return False


async def tensor(far: bool, repeats: int) -> dict[str, Any]:
    homes = {"s": "b"}
    sink = _Sink()
    a, b = Switchboard("a", homes), Switchboard("b", homes, stages={"s": sink})
    t = torch.ones(TENSOR_BYTES // 4, dtype=torch.float32)
    seconds = []
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await nursery.start(b.run)
        address_a = await a.listen("tcp://127.0.0.1:*", "omnitrio-bench-a-")
        address_b = await b.listen(f"tcp://{'127.0.0.2' if far else '127.0.0.1'}:*", "omnitrio-bench-b-")
        a.peer_up("b", address_b)
        b.peer_up("a", address_a)
        for i in range(repeats + 1):
            start = time.perf_counter()
            a.send(Payload(f"r{i}", 0, "s", "src", t))
            body, leases = await sink.received.receive()
            elapsed = time.perf_counter() - start
            assert body.shape == t.shape
            del body
            b.release(leases)
            if i:
                seconds.append(elapsed)
        nursery.cancel_scope.cancel()
    median = statistics.median(seconds)
    return {"gb_per_s": TENSOR_BYTES / median / 1e9, "median_s": median, "n": repeats}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"loadavg_before": loadavg()}
    if args.only in (None, "tensor"):
        results["tensor_tcp_frames"] = await tensor(True, args.repeats)
        results["tensor_tcp_shm"] = await tensor(False, args.repeats)
    if args.only in (None, "hop"):
        with ray_cluster(num_cpus=2):  # both chains run beside the cluster's own processes
            results["hop_ray"] = await hop("ray", args.requests)
            results["hop_local"] = await hop("local", args.requests)
    results["loadavg_after"] = loadavg()
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", choices=("tensor", "hop"), help="run one of the two measurements")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ray_tcp.json")
    args = parser.parse_args()
    out = trio.run(main, args)
    print(json.dumps(out, indent=2))
    path = args.out
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")
