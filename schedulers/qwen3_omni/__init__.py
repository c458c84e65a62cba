"""Qwen3-Omni served for real: transformers' model classes, one stage per part, the scheduling around them."""
