"""Stages with a warm-up, for the tests of the warm-up hook: one whose named steps record that they ran,
one whose warm-up waits on :data:`GATE` (a test sets it when it is done)."""

from __future__ import annotations

import threading

from schedulers.simple import SimpleScheduler
from schedulers.warm_up import WarmUp

W = "tests.warm_stages"

GATE = threading.Event()
RAN: list[str] = []


def create_warmed(steps: list[str]) -> SimpleScheduler:
    warm_up = WarmUp()
    for step in steps:
        warm_up.step(step, lambda step=step: RAN.append(step))
    return SimpleScheduler(lambda payload: payload, warm_up=warm_up)


def create_slow_warm_up() -> SimpleScheduler:
    return SimpleScheduler(lambda payload: payload, warm_up=WarmUp().step("gate", lambda: GATE.wait(60)))


def create_broken() -> SimpleScheduler:
    raise RuntimeError("this stage never starts")
