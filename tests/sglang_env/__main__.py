"""``python -m tests.sglang_env setup | test [PYTEST ARGS]``: build the SGLang venv; run its tests there."""

from __future__ import annotations

import sys

from tests.sglang_env import run_tests, setup


def main(argv: list[str]) -> int:
    match argv:
        case ["setup"]:
            setup()
            return 0
        case ["test", *rest]:
            return run_tests(rest)
        case _:
            print("usage: python -m tests.sglang_env setup | test [PYTEST ARGS]", file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
