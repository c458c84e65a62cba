"""Importing this maps a file named like the CUDA driver library (see :mod:`tests.fork_stages`)."""

from __future__ import annotations

import mmap
import os
import tempfile

from tests.fork_stages import create_where

__all__ = ["create_where"]

_fd, _path = tempfile.mkstemp(prefix="libcuda.so.omnitrio-test-")
os.write(_fd, b"\0" * mmap.PAGESIZE)
MAPPED = mmap.mmap(_fd, mmap.PAGESIZE, prot=mmap.PROT_READ)
os.close(_fd)
os.unlink(_path)
