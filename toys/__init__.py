"""Toy stages, fixtures and helpers that tests/ and bench/ share (not shipped with the package).

``toys.seed`` holds the seed chapter's three experiments and their stage modules (the seed's own
source in ``bench/peer/seed``, run with omnitrio's imports by ``toys.seed.port``); ``toys.stages`` and
``toys.stream_stages`` are small stage factories; ``toys.speech_text`` the sentences and word error rate the speech
round trip is judged by; ``toys.venvs`` builds the side virtualenvs (the peer's for bench/,
SGLang's for tests/); ``toys.realtime_clients`` runs realtime client libraries (each in its own
venv) against a served pipeline, for tests/test_realtime_clients.py and bench/realtime_clients.py.
"""
