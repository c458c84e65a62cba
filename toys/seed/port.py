"""The seed's stage modules on omnitrio: the seed chapter's own source with its imports changed, nothing else.

``bench/peer/seed/`` holds the seed's stage modules as the seed wrote them, which the peer (SGLang-Omni)
runs.  :func:`port` runs one of them as the calling module, each ``from sglang_omni... import`` line
naming instead the omnitrio module that holds the same names (:data:`MODULES`).  Every other line is the
seed's, at the seed's line number, and tracebacks name the seed's file.  A seed import this table does
not know is a ``KeyError`` naming it.
"""

from __future__ import annotations

import sys
from pathlib import Path

MODULES = {
    "sglang_omni.proto": "omnitrio.contract",
    "sglang_omni.scheduling.message": "omnitrio.contract",
    "sglang_omni.scheduling.simple_scheduler": "schedulers.simple",
    "sglang_omni.scheduling.streaming_simple_scheduler": "schedulers.streaming",
}
SEED = Path(__file__).resolve().parents[2] / "bench" / "peer" / "seed"


def ported_source(seed_module: str) -> tuple[str, Path]:
    """The source of ``bench/peer/seed/<seed_module>.py`` with omnitrio's modules in its imports, and its path."""
    path = SEED / f"{seed_module}.py"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    for number, line in enumerate(lines):
        if line.startswith("from sglang_omni"):
            peer = line.split()[1]
            lines[number] = line.replace(peer, MODULES[peer], 1)
    return "".join(lines), path


def port(module_name: str, seed_module: str) -> None:
    """Run the seed's ``seed_module`` (ported: :func:`ported_source`) as the module ``module_name``."""
    source, path = ported_source(seed_module)
    exec(compile(source, str(path), "exec"), sys.modules[module_name].__dict__)
