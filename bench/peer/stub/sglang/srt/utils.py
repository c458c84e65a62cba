"""Stand-in for ``sglang.srt.utils``: the names sglang-omni's stage workers import."""

from __future__ import annotations

import os
import signal
import threading
import time


def kill_itself_when_parent_died() -> None:
    """Exit this process when its parent goes away (a watcher thread; sglang uses prctl on Linux)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
