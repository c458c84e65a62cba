"""What a stage process's two Python threads cost each other: per-call µs, alone and contended.

A stage process runs trio in one thread and the scheduler in another, and they share one
GIL.  Most torch calls release the GIL and take it back when done; while the other thread
is running Python, taking it back waits for that thread to drop it, which it does only
once per switch interval.  So a call that costs a few µs alone can cost a switch interval
when the other thread is busy.  This probe measures it for the calls on the streaming
path: the relay's pack and unpack of one stream chunk (the seed talker's 2-element
tensor in a ``StreamItem``), the seed vocoder's hook op (``codes * 100``), and for
comparison ``tolist()``, ``torch.tensor(list)`` and ``torch.from_numpy(numpy.array(list))``,
which keep the GIL.

"Contended" means a second thread runs a pure-Python loop the whole time (the worst case:
a scheduler thread busy in Python).  The switch interval is the one stage processes use
(1 ms, ``omnitrio.child``).  Figures are the mean µs per call over ``--calls`` calls,
median of 3 runs.

Run: ``python bench/gil_probe.py [--calls 2000]``.  Writes ``bench/results/gil_probe.json``.
Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.measure import loadavg  # noqa: E402
from omnitrio.contract import StreamItem  # noqa: E402
from omnitrio.transport.relay import ShmPool, ShmReader  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "gil_probe.json"
SWITCH_INTERVAL = 0.001


@contextmanager
def busy_thread() -> Iterator[None]:
    """A second thread running Python until the block exits."""
    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    thread = threading.Thread(target=spin, name="busy-python", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sys.setswitchinterval(SWITCH_INTERVAL)
    codes = torch.tensor([11, 12])
    values = codes.tolist()
    with ShmPool("omnitrio-gilprobe-", slots=2) as pool, ShmReader() as reader:
        header = pool.pack(StreamItem(0, codes, "talker", {"step": 0})).header
        probes: dict[str, Callable[[], object]] = {
            "relay pack of a stream chunk": lambda: pool.pack(StreamItem(0, codes, "talker", {"step": 0})),
            "relay unpack of a stream chunk": lambda: reader.unpack(header),
            "codes * 100 (the seed vocoder's hook)": lambda: codes * 100,
            "codes.tolist()": lambda: codes.tolist(),
            "torch.tensor(list)": lambda: torch.tensor(values),
            "torch.from_numpy(numpy.array(list))": lambda: torch.from_numpy(numpy.array(values, dtype="int64")),
        }
        rows = {}
        load_before = loadavg()
        for name, fn in probes.items():
            alone = per_call_us(fn, args.calls)
            with busy_thread():
                contended = per_call_us(fn, args.calls)
            rows[name] = {"alone_us": alone, "contended_us": contended}
            print(f"{name:40s} alone {alone:8.1f} µs   with a busy Python thread {contended:9.1f} µs")
    out = {
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "switch_interval_s": SWITCH_INTERVAL,
        "calls": args.calls,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "load_before": load_before,
        "load_after": loadavg(),
        "per_call": rows,
    }
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
