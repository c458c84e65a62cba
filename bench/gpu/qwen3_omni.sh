#!/usr/bin/env bash
# Qwen3-Omni on one CUDA GPU: bench/gpu/omni.sh's Qwen3-Omni half (it says what runs).
exec "$(dirname "$0")/omni.sh" qwen3
