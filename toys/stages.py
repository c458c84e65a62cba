"""Small stage factories and routing functions the core tests build pipelines from."""

from __future__ import annotations

import threading
import time
from typing import Any

from omnitrio.contract import IncomingMessage, OutgoingMessage, StagePayload
from schedulers.simple import SimpleScheduler
from toys.hand_scheduler import HandScheduler

# Stage factories ---------------------------------------------------------------------


def create_echo() -> SimpleScheduler:
    return SimpleScheduler(lambda payload: payload)


def create_tag(tag: str = "x") -> SimpleScheduler:
    """Appends ``tag`` to ``data["path"]`` so tests can see which stages a request crossed."""

    def fn(payload: StagePayload) -> StagePayload:
        data = payload.data if isinstance(payload.data, dict) else {}
        path = list(data.get("path", []))
        payload.data = {**data, "path": [*path, tag]}
        return payload

    return SimpleScheduler(fn)


def create_words() -> SimpleScheduler:
    def fn(payload: StagePayload) -> StagePayload:
        text = payload.data["raw_inputs"]
        payload.data = {"text": text, "words": text.split()}
        return payload

    return SimpleScheduler(fn)


def create_boom() -> SimpleScheduler:
    """Raises ValueError when the input contains 'boom'; otherwise echoes."""

    def fn(payload: StagePayload) -> StagePayload:
        if "boom" in str(payload.data):
            raise ValueError("count exploded on purpose")
        return payload

    return SimpleScheduler(fn)


def create_slow(seconds: float = 0.2) -> SimpleScheduler:
    """Sleeps ``seconds`` (interruptibly by abort) and echoes."""
    aborted: set[str] = set()
    lock = threading.Lock()

    def fn(payload: StagePayload) -> StagePayload:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with lock:
                if payload.request_id in aborted:
                    break
            time.sleep(0.005)
        return payload

    def on_abort(rid: str) -> None:
        with lock:
            aborted.add(rid)

    return SimpleScheduler(fn, max_concurrency=8, abort_callback=on_abort)


def create_needs_arg(size: int) -> SimpleScheduler:
    return SimpleScheduler(lambda payload: payload)


def create_raises_on_build() -> SimpleScheduler:
    raise RuntimeError("cannot load weights on purpose")


# Routing functions ---------------------------------------------------------------------


def route_by_length(request_id: str, payload: StagePayload) -> list[str]:
    return ["upper"] if len(payload.data["words"]) == 1 else ["upper", "count"]


def wait_by_length(request_id: str, from_stage: str, payload: StagePayload) -> list[str]:
    return ["upper"] if len(payload.request.inputs.split()) == 1 else ["upper", "count"]


def route_to_nowhere(request_id: str, payload: Any) -> str:
    return "nowhere"


def route_raises(request_id: str, payload: Any) -> str:
    if "boom" in str(payload.data):
        raise KeyError("no route for boom")
    return "b"


def project_text(payload: StagePayload) -> StagePayload:
    return StagePayload(payload.request_id, payload.request, {"text": payload.data["text"]})


def project_words(payload: StagePayload) -> StagePayload:
    return StagePayload(payload.request_id, payload.request, {"words": list(payload.data["words"])})


def project_shared(payload: StagePayload) -> StagePayload:
    """Shares the original's list: the runtime must copy before handing it over."""
    return StagePayload(payload.request_id, payload.request, {"words": payload.data["words"]})


def project_raises(payload: StagePayload) -> StagePayload:
    if "boom" in payload.data["text"]:
        raise RuntimeError("projection broke")
    return project_text(payload)


def merge_by_name(inputs: dict[str, StagePayload]) -> StagePayload:
    first = next(iter(inputs.values()))
    data: dict[str, Any] = {"sources": sorted(inputs)}
    for name in sorted(inputs):
        data[name] = inputs[name].data
    return StagePayload(first.request_id, first.request, data)


def merge_raises(inputs: dict[str, StagePayload]) -> StagePayload:
    first = next(iter(inputs.values()))
    if "boom" in str(first.request.inputs):
        raise ZeroDivisionError("merge broke")
    return merge_by_name(inputs)


def create_mutating_upper() -> SimpleScheduler:
    """Mutates what it received in place; other branches must not see it."""

    def fn(payload: StagePayload) -> StagePayload:
        payload.data["words"].append("MUTATED")
        return payload

    return SimpleScheduler(fn)


def create_pid() -> SimpleScheduler:
    """Records which process ran it, so tests can find a stage's process."""
    import os

    def fn(payload: StagePayload) -> StagePayload:
        data = payload.data if isinstance(payload.data, dict) else {}
        payload.data = {**data, "pids": [*data.get("pids", []), os.getpid()]}
        return payload

    return SimpleScheduler(fn)


def create_niceness() -> SimpleScheduler:
    """Reports the niceness of the thread that computes and of the process's main thread."""
    import os
    import threading

    def fn(payload: StagePayload) -> dict[str, int]:
        return {
            "scheduler": os.getpriority(os.PRIO_PROCESS, threading.get_native_id()),
            "main": os.getpriority(os.PRIO_PROCESS, os.getpid()),
        }

    return SimpleScheduler(fn)


def create_tensor_maker(device: str = "cpu") -> SimpleScheduler:
    """Returns tensors of several dtypes and shapes on ``device``, nested, as the input asks."""
    import torch

    def fn(payload: StagePayload) -> StagePayload:
        n = int(payload.data["raw_inputs"])
        big = torch.arange(n, dtype=torch.float32, device=device)
        payload.data = {
            "big": big,
            "nested": [{"half": big[:16].half(), "bf16": big[:8].to(torch.bfloat16)}],
            "transposed": torch.arange(12, dtype=torch.int64, device=device).reshape(3, 4).t(),
            "empty": torch.zeros(0, 5, device=device),
            "flags": torch.tensor([True, False], device=device),
        }
        return payload

    return SimpleScheduler(fn)


def create_tensor_summary() -> SimpleScheduler:
    """Summarises what arrived, so the caller can check it crossed intact."""

    def fn(payload: StagePayload) -> StagePayload:
        d = payload.data
        tensors = [d["big"], d["nested"][0]["half"], d["nested"][0]["bf16"], d["transposed"], d["empty"], d["flags"]]
        payload.data = {
            "devices": sorted({str(t.device) for t in tensors}),
            "big_sum": float(d["big"].sum()),
            "big_len": d["big"].numel(),
            "half": d["nested"][0]["half"].float().tolist(),
            "bf16_dtype": str(d["nested"][0]["bf16"].dtype),
            "transposed": d["transposed"].tolist(),
            "empty_shape": list(d["empty"].shape),
            "flags": d["flags"].tolist(),
            "tail": d["big"][-3:].clone(),
        }
        return payload

    return SimpleScheduler(fn)


def create_unpicklable() -> SimpleScheduler:
    """Returns a lambda for input 'lambda': it cannot cross a process boundary."""

    def fn(payload: StagePayload) -> StagePayload:
        if payload.data["raw_inputs"] == "lambda":
            payload.data = {"fn": lambda: None}
        return payload

    return SimpleScheduler(fn)


class CrashingScheduler(HandScheduler):
    """Echoes requests; its start() raises when a request asks it to 'crash'."""

    def on_request(self, msg: IncomingMessage) -> None:
        if msg.data.data["raw_inputs"] == "crash":
            raise RuntimeError("scheduler loop broke on purpose")
        self.outbox.put(OutgoingMessage(msg.request_id, "result", data=msg.data))


def create_crashing() -> CrashingScheduler:
    return CrashingScheduler()


def wait_for_raises(request_id: str, from_stage: str, payload: StagePayload) -> list[str]:
    raise LookupError("wait_for_fn broke")


def stream_done_raises(request_id: str, result: Any) -> list[str]:
    raise ValueError("stream_done_to_fn broke")


def create_request_echo() -> SimpleScheduler:
    """Returns what the stage saw of the request: inputs, params and metadata."""

    def fn(payload: StagePayload) -> StagePayload:
        r = payload.request
        payload.data = {"inputs": r.inputs, "params": r.params, "metadata": r.metadata}
        return payload

    return SimpleScheduler(fn)


def create_batch_size_reporter(max_batch_size: int = 64) -> SimpleScheduler:
    """Batches without waiting; each result says how big its batch was."""

    def batch_fn(payloads: list[StagePayload]) -> list[StagePayload]:
        for payload in payloads:
            payload.data = {"batch": len(payloads)}
        return payloads

    return SimpleScheduler(
        None, batch_compute_fn=batch_fn, max_batch_size=max_batch_size, max_batch_wait_ms=0, batch_wait_when_idle=False
    )


def create_filler() -> SimpleScheduler:
    """A 1 MB float32 tensor (through shared memory) filled with the request's input number."""
    import torch

    def fn(payload: StagePayload) -> StagePayload:
        payload.data = torch.full((1 << 18,), float(payload.data["raw_inputs"]))
        return payload

    return SimpleScheduler(fn)


def create_late_reader(delay: float = 0.3) -> SimpleScheduler:
    """Waits ``delay`` s, then reports the value its tensor holds (and whether all of it agrees)."""

    def fn(payload: StagePayload) -> StagePayload:
        time.sleep(delay)
        t = payload.data
        payload.data = {"value": float(t[0]), "uniform": bool((t == t[0]).all())}
        return payload

    return SimpleScheduler(fn)


def create_not_a_scheduler() -> object:
    """A factory that returns something without inbox, outbox, start, stop or abort."""
    return object()
