"""Importing this in a pipeline's fork server waits until someone opens the FIFO
``$OMNITRIO_TEST_IMPORT_GATE`` for writing and closes it (see :mod:`tests.fork_stages`)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.fork_stages import create_where

__all__ = ["create_where"]

GATE_ENV = "OMNITRIO_TEST_IMPORT_GATE"

if GATE_ENV in os.environ and os.environ.get("OMNITRIO_PARENT_PID") == str(os.getppid()):
    Path(os.environ[GATE_ENV]).read_text()
