"""Stages for the supervision tests: a scheduler that crashes on request and cannot be rebuilt."""

from __future__ import annotations

from typing import Any

from omnitrio.contract import StagePayload
from toys.stages import CrashingScheduler, create_echo

_BUILDS: dict[str, int] = {}
"""Schedulers built per ``key`` in this process (each test passes its own key)."""


class StartRaises(CrashingScheduler):
    """A rebuilt scheduler whose start() raises before it takes anything."""

    def start(self) -> None:
        raise RuntimeError("start() broke at once")


def create_fragile(key: str, rebuild: str = "start_raises") -> CrashingScheduler:
    """The first build serves (and crashes on "crash"); every later one fails as ``rebuild`` says."""
    _BUILDS[key] = _BUILDS.get(key, 0) + 1
    if _BUILDS[key] == 1:
        return CrashingScheduler()
    if rebuild == "factory_raises":
        raise RuntimeError("the factory cannot rebuild")
    return StartRaises()


def builds(key: str) -> int:
    return _BUILDS.get(key, 0)


def create_steady() -> Any:
    return create_echo()


def route_by_input(request_id: str, payload: StagePayload) -> list[str]:
    return ["steady" if payload.data["raw_inputs"].startswith("steady") else "fragile"]


def terminal_by_input(request_id: str, inputs: Any) -> list[str]:
    return ["steady" if str(inputs).startswith("steady") else "fragile"]
