"""Importing this fails in a pipeline's stage processes and its fork server (whose environment names
their caller), and works in the caller (see :mod:`tests.fork_stages`)."""

from __future__ import annotations

import os

from tests.fork_stages import create_where

__all__ = ["create_where"]

if "OMNITRIO_PARENT_PID" in os.environ:
    raise ImportError("fork_stages_broken cannot be imported in a stage process")
