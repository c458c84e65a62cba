"""Soak: thousands of mixed requests through pipelines with one process per stage.

Successes, compute failures, aborts at random points, deadlines, caller cancellations
and one kill -9 of a stage process, concurrently.  Afterwards every stage's and the
coordinator's per-request state must be empty, no shared memory of ours may be left,
and each process's RSS may grow by less than 5 MB over the second half of the run.

    python -m bench.soak [--requests 20000] [--concurrency 64] [--samples 10] [--fan-only] [--out soak.json]

``--samples`` RSS readings of every process are taken at even steps over the run (the curve
shows whether memory levels off); ``--fan-only`` skips the streaming pipeline.  Prints the
figures and writes ``bench/results/soak.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import attrs
import trio

from toys.soak import fan_pipeline, soak, stream_pipeline

RESULTS = Path(__file__).parent / "results"


async def main(requests: int, concurrency: int, samples: int, fan_only: bool) -> list[dict[str, Any]]:
    reports = [await soak(fan_pipeline(), requests, concurrency, kill_stage="upper", samples=samples)]
    if not fan_only:
        reports.append(await soak(stream_pipeline(), requests // 4, concurrency, kill_stage="vocoder", samples=samples))
    return [attrs.asdict(r) | {"clean": r.clean} for r in reports]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--samples", type=int, default=10, help="RSS readings per pipeline run")
    parser.add_argument("--fan-only", action="store_true", help="skip the streaming pipeline")
    parser.add_argument("--out", default="soak.json", help="file name under bench/results/")
    args = parser.parse_args()
    results = trio.run(main, args.requests, args.concurrency, args.samples, args.fan_only)
    RESULTS.mkdir(exist_ok=True)
    out = {"load_average": os.getloadavg(), "results": results}
    (RESULTS / args.out).write_text(json.dumps(out, indent=2))
    for r in results:
        print(json.dumps(r, indent=2))
