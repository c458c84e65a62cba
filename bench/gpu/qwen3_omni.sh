#!/usr/bin/env bash
# Qwen3-Omni on one CUDA GPU (issue 36 item 7): the CPU suite's equality checks with the stages on CUDA, then
# the benchmark on CUDA beside transformers' generate on CUDA. Under 10 minutes on one H200.
#
#   bench/gpu/qwen3_omni.sh                 # PY=/path/to/python to use another interpreter
#
# Needs a CUDA build of torch in the interpreter (the project pins the CPU wheel; on a GPU machine install
# the same torch version from PyTorch's CUDA index first) and the omni + test extras.
#
# Every model stage goes on CUDA through serve's flag (`--device cuda`, what the tests' and the bench's
# load(..., device=...) sets): preprocess (its log-mel), the audio and image encoders, the thinker, the talker
# (+ code predictor) and code2wav.
#
# 0. `omnitrio check --device cuda --dtype bfloat16` on a tiny checkpoint: every model stage says it can run
#    there (the flag reaches each, and the device helper sees the GPU).
# 1. tests/test_qwen3_omni_pipeline.py and tests/test_qwen3_omni_serve.py with OMNITRIO_QWEN3_OMNI_DEVICE=cuda:
#    every model stage on CUDA in float32, compared with transformers' generate on the CPU (same tiny
#    checkpoint): thinker ids and codes identical, waveform >= 60 dB (CUDA's float32 kernels round
#    differently from the CPU's; NVIDIA_TF32_OVERRIDE=0 keeps convolutions and matmuls at float32, else
#    TF32's 10-bit mantissa would blur the comparison); inline and one process per stage, 8 concurrent
#    requests, abort frees every stage, the HTTP API.
# 2. bench/qwen3_omni.py --device cuda: time to first audio and audio seconds per wall second at 1, 4, 8
#    concurrent requests, tiny and medium checkpoints, generate on CUDA as the baseline, in float32
#    (bench/results/qwen3_omni_gpu.json) and, short, in bfloat16 (bench/results/qwen3_omni_gpu_bf16.json).
#
# The thinker on SGLang is not a variant here: the SGLang adapter (schedulers/ar/sglang_backend.py) takes a
# text prompt and returns token ids and last-layer hidden states, while the real talker needs, per request,
# the prompt's input embeddings with the audio/image features scattered in and the accept_hidden_layer
# states (transformers' generate builds the talker's prompt from both), and the real thinker must be fed
# the audio/image encoders' embeddings.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
export NVIDIA_TF32_OVERRIDE=0
export OMNITRIO_QWEN3_OMNI_DEVICE=cuda
export PYTHONPATH=${PYTHONPATH:-.}

"$PY" - <<'EOF'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit(f"bench/gpu/qwen3_omni.sh: torch {torch.__version__} sees no CUDA device; install a CUDA build of torch")
print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
EOF

echo "== every model stage can run on CUDA (check --device cuda --dtype bfloat16)"
TINY=$(mktemp -d)/tiny-omni
trap 'rm -rf "$(dirname "$TINY")"' EXIT
"$PY" -m omnitrio tiny-model qwen3-omni "$TINY" >/dev/null
"$PY" -m omnitrio check --model "$TINY" --device cuda --dtype bfloat16 configs/qwen3-omni.toml >/dev/null

echo "== equality on CUDA (pipeline: inline and one process per stage; HTTP)"
timeout 300 "$PY" -m pytest tests/test_qwen3_omni_pipeline.py tests/test_qwen3_omni_serve.py \
    -q -x -n 0 -p no:cacheprovider

echo "== benchmark on CUDA"
timeout 240 "$PY" bench/qwen3_omni.py --device cuda --dtype float32 --out bench/results/qwen3_omni_gpu.json
timeout 120 "$PY" bench/qwen3_omni.py --device cuda --dtype bfloat16 --quick --out bench/results/qwen3_omni_gpu_bf16.json
