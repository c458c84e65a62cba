"""Qwen2.5-Omni's token2wav (a flow-matching DiT, then BigVGAN) as a streaming, batched stage.

:mod:`.stage` is the scheduler (talker codes in, 24 kHz audio out); :mod:`.stream` one request's decode;
:mod:`.windows` which mel frames each chunk decodes; :mod:`.ode` transformers' Runge-Kutta solver one
evaluation at a time; :mod:`.noise` the request's initial noise; :mod:`.model` transformers' modules.
"""
