"""Graph pieces every pipeline family composes: the ingress's task routing and the omni front's routes.

* :mod:`.tasks`: which task a request is (chat, speech, transcription, an ASR session), whether its
  answer is spoken, the ASR stages that serve a realtime session's turn detection and its input
  transcription, and the ingress's admission of a session command;
* :mod:`.front`: the front of an omni model (``preprocess`` → the encoders a request needs →
  ``aggregate``): which encoders a request visits and what ``aggregate`` waits for.

A family's own graph module (``schedulers.speech.pipeline``, ``schedulers.qwen3_omni.graph``) names its
stages and composes these.  An omni family's holds two objects: ``EDGES``, a :class:`.front.FrontEdges`
over its handoff classes (the front's projections and ``aggregate``'s merge), and ``TASKS``, a
:class:`.tasks.TaskRoutes` over its stage names (the ingress's and the thinker's routes, the terminal
stages).  Its config names their methods with the colon form (``schedulers.qwen3_omni.graph:EDGES.merge_aggregate``)
and the shared functions where they live (``schedulers.graph.front.route_preprocess``).
"""
