"""Realtime client libraries run as users run them, against a served pipeline.

``NAME.py`` scripts (one per library, on :mod:`.common`, each run with its library's venv from
:mod:`.venvs`) and :mod:`.drive`, which writes their settings and runs them for
``tests/test_realtime_clients.py`` and ``bench/realtime_clients.py``.
"""
