"""The seed's ``bench/peer/seed/ch4_stream_stages.py`` run on omnitrio (:mod:`toys.seed.port`)."""

from toys.seed.port import port

port(__name__, "ch4_stream_stages")
