"""Autoregressive stages: the CPU torch continuous-batching engine, its SGLang twin, talker, vocoder."""
