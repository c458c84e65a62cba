"""Qwen3-Omni's graph: its front's handoff classes and its stages' names, composed from :mod:`schedulers.graph`.

Past the shared ingress (:mod:`schedulers.graph.tasks`) and front (:mod:`schedulers.graph.front`), a chat
runs::

    aggregate ─▶ thinker ─┬─▶ decode                 (text, terminal)
                   stream ┘└─▶ talker ─▶ code2wav    (audio, terminal)

The thinker streams its tokens to ``decode`` and the talker and ends with a
:class:`~schedulers.engine.handoffs.ThinkerResult`; the talker streams :class:`~.handoffs.Codes` to
code2wav and ends with a :class:`~.handoffs.TalkerResult`.
"""

from __future__ import annotations

from schedulers.front.handoffs import ImageEmbeddings, Preprocessed, PreprocessedText, ThinkerInput
from schedulers.graph.front import PREPROCESS, FrontEdges
from schedulers.graph.tasks import TaskRoutes

EDGES = FrontEdges(Preprocessed, PreprocessedText, ImageEmbeddings, ThinkerInput)
TASKS = TaskRoutes(model=PREPROCESS, text="decode", talker="talker", audio="code2wav")
