"""CUDA tensors through the shared-memory relay, against torch's own pickling: GB/s.

Needs a CUDA device (run it on the GPU machine).  Three figures per size, each the median
of ``--repeats`` runs after one warm-up:

* ``relay``: :meth:`ShmPool.pack` (device → shared memory) then :meth:`ShmReader.unpack`
  (shared memory → the same device), in one process: the copies a hop pays;
* ``pickle``: ``pickle.loads(pickle.dumps(t))``, what crossing cost before the relay knew
  CUDA tensors;
* ``floor``: one device → host copy into a pre-faulted pageable buffer and one back;
* ``pipeline``: a stage in one process returns the tensor to a stage in another, which
  checks it on the GPU (``bench.toy_stages`` tensor pair): size / request p50.

Run: ``python bench/cuda_relay.py [--repeats 7]``.  Writes ``bench/results/cuda_relay.json``.
Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import omnitrio  # noqa: E402
from bench import pipelines  # noqa: E402
from bench.measure import MIB  # noqa: E402
from bench.toy_stages import SIZES_MB  # noqa: E402
from omnitrio import open_pipeline  # noqa: E402
from omnitrio.transport.relay import ShmPool, ShmReader  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "cuda_relay.json"


def median_s(fn: Callable[[], object], repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def in_process(mb: int, repeats: int) -> dict[str, float]:
    t = torch.arange(mb * MIB // 4, dtype=torch.float32, device="cuda:0")
    host = torch.empty(t.shape, dtype=t.dtype)
    host.fill_(0)  # fault it in
    back = torch.empty_like(t)
    with ShmPool(f"omnitrio-bench-cuda-{os.getpid()}-", slots=64) as pool, ShmReader() as reader:

        def relay() -> None:
            out, leases = reader.unpack(pool.pack(t, inline_limit=0).header)
            pool.release(leases)
            assert out.device == t.device

        def floor() -> None:
            host.copy_(t)
            back.copy_(host)

        figures = {
            "relay": median_s(relay, repeats),
            "pickle": median_s(lambda: pickle.loads(pickle.dumps(t, protocol=5)), repeats),
            "floor": median_s(floor, repeats),
        }
    return {f"{name}_GB_per_s": mb * MIB / 1e9 / seconds for name, seconds in figures.items()}


async def pipeline(repeats: int) -> dict[int, float]:
    config = pipelines.tensor_pair(omnitrio, process=True, device="cuda:0")
    out: dict[int, float] = {}
    async with open_pipeline(config) as api:
        for mb in SIZES_MB:
            samples = []
            for i in range(repeats + 1):
                t0 = time.perf_counter()
                result = await api.submit(f"t{mb}-{i}", mb)
                samples.append(time.perf_counter() - t0)
                if result["nbytes"] != mb * MIB:
                    raise RuntimeError(f"sink saw {result['nbytes']} bytes, expected {mb * MIB}")
            out[mb] = mb * MIB / 1e9 / statistics.median(samples[1:])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/cuda_relay.py needs a CUDA device")
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "repeats": args.repeats,
        "sizes": {},
    }
    across = trio.run(pipeline, args.repeats)
    for mb in SIZES_MB:
        figures = {**in_process(mb, args.repeats), "pipeline_GB_per_s": across[mb]}
        results["sizes"][f"{mb}MB"] = figures
        print(f"{mb:>4} MB  " + "  ".join(f"{k.removesuffix('_GB_per_s')} {v:6.2f} GB/s" for k, v in figures.items()))
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
