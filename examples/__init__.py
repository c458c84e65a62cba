"""Runnable examples (``python -m examples.words``); the README shows their code."""
