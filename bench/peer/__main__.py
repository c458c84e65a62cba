"""``python -m bench.peer setup | seed``: build the peer's venv; run the seed's experiments on it verbatim.

``seed`` runs ``bench/peer/seed/ch4_fanin.py`` and ``ch4_stream.py`` (the seed chapter's
scripts, unchanged) with the peer's interpreter and prints their output, as a check that
the peer and the stub behave as the seed printed.
"""

from __future__ import annotations

import subprocess
import sys

from bench.peer import setup_venv


def seed() -> int:
    status = 0
    for script in ("ch4_fanin.py", "ch4_stream.py"):
        print(f"== {script}", flush=True)
        done = subprocess.run(
            [str(setup_venv.python()), script], cwd=setup_venv.PEER_DIR / "seed", env=setup_venv.peer_env(), check=False
        )
        status = status or done.returncode
    return status


def main(argv: list[str]) -> int:
    match argv:
        case ["setup"]:
            setup_venv.setup()
            return 0
        case ["seed"]:
            return seed()
        case _:
            print("usage: python -m bench.peer setup | seed", file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
