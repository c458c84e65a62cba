"""Qwen2.5-Omni's graph, built from the family-agnostic pieces of :mod:`schedulers.graph` over the handoffs of
:mod:`.handoffs`.  From ``aggregate`` on a chat goes::

    aggregate ─▶ thinker ─┬─▶ decode                  (text, terminal)
                   stream ┘└─▶ talker ─▶ token2wav    (audio, terminal)

where the talker hands token2wav :class:`~.handoffs.TalkerCodes` and then :class:`~.handoffs.TalkerDone`.
"""

from __future__ import annotations

from schedulers.front.handoffs import ImageEmbeddings, Preprocessed, PreprocessedText, ThinkerInput
from schedulers.graph.front import PREPROCESS, FrontEdges
from schedulers.graph.tasks import TaskRoutes

EDGES = FrontEdges(Preprocessed, PreprocessedText, ImageEmbeddings, ThinkerInput)
TASKS = TaskRoutes(model=PREPROCESS, text="decode", talker="talker", audio="token2wav")
