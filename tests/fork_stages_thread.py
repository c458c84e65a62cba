"""Importing this starts a thread that runs until the process ends (see :mod:`tests.fork_stages`)."""

from __future__ import annotations

import threading

from tests.fork_stages import create_where

__all__ = ["create_where"]

threading.Thread(target=threading.Event().wait, name="started-on-import", daemon=True).start()
