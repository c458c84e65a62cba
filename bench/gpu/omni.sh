#!/usr/bin/env bash
# Both omni families on one CUDA GPU (issue 36 item 7, issue 42 item 6): per family, the CPU suite's equality
# checks with the stages on CUDA, then its benchmark on CUDA beside transformers' generate on CUDA.
#
#   bench/gpu/omni.sh                 # both families (about 20 minutes on one H200)
#   bench/gpu/omni.sh qwen3           # Qwen3-Omni only (under 10 minutes); bench/gpu/qwen3_omni.sh says this
#   bench/gpu/omni.sh qwen2.5         # Qwen2.5-Omni only (under 10 minutes)
#   PY=/path/to/python bench/gpu/omni.sh   # another interpreter
#
# Needs a CUDA build of torch in the interpreter (the project pins the CPU wheel; on a GPU machine install
# the same torch version from PyTorch's CUDA index first) and the omni + test extras.
#
# Every model stage goes on CUDA through serve's flag (`--device cuda`, what the tests' and the benches'
# load(..., device=...) sets): preprocess (its log-mel), the audio and image encoders, the thinker, the talker
# (+ Qwen3's code predictor) and the vocoder (Qwen3's code2wav, Qwen2.5's token2wav: its DiT and BigVGAN;
# the DiT's noise is still drawn on the CPU).
#
# Per family:
# 0. `omnitrio check --device cuda --dtype bfloat16` on a tiny checkpoint: every model stage says it can run
#    there (the flag reaches each, and the device helper sees the GPU).
# 1. Equality on CUDA: every model stage on CUDA in float32, compared with transformers' generate on the
#    CPU (same tiny checkpoint): thinker ids (and Qwen3's codes) identical, waveforms >= 60 dB (CUDA's
#    float32 kernels round differently from the CPU's; NVIDIA_TF32_OVERRIDE=0 keeps convolutions and
#    matmuls at float32, else TF32's 10-bit mantissa would blur the comparison).
#    Qwen3-Omni: tests/test_qwen3_omni_pipeline.py and tests/test_qwen3_omni_serve.py
#    (OMNITRIO_QWEN3_OMNI_DEVICE=cuda): inline and one process per stage, 8 concurrent requests, abort
#    frees every stage, the HTTP API.
#    Qwen2.5-Omni: every tests/test_qwen2_5_omni_*.py that places its pipeline by
#    tests/qwen2_5_omni_reference.py's DEVICE (OMNITRIO_QWEN2_5_OMNI_DEVICE=cuda); the script lists them.
# 2. The benchmark on CUDA: time to first audio and audio seconds per wall second at 1, 4, 8 concurrent
#    requests, tiny and medium checkpoints, generate on CUDA as the baseline, in float32
#    (bench/results/<family>_gpu.json) and, short, in bfloat16 (bench/results/<family>_gpu_bf16.json).
#    Qwen2.5-Omni's rows: streamed and whole (the requests' stream flag).
#
# The thinker on SGLang is not a variant here: the SGLang adapter (schedulers/ar/sglang_backend.py) takes a
# text prompt and returns token ids and last-layer hidden states, while the real talkers need, per request,
# the prompt's input embeddings with the audio/image features scattered in and hidden states (transformers'
# generate builds the talker's prompt from both), and the real thinkers must be fed the encoders' embeddings.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
FAMILY=${1:-all}
case "$FAMILY" in
    all | qwen3 | qwen2.5) ;;
    *) echo "usage: bench/gpu/omni.sh [all|qwen3|qwen2.5]" >&2; exit 2 ;;
esac
export NVIDIA_TF32_OVERRIDE=0
export OMNITRIO_QWEN3_OMNI_DEVICE=cuda
export OMNITRIO_QWEN2_5_OMNI_DEVICE=cuda
export PYTHONPATH=${PYTHONPATH:-.}

"$PY" - <<'EOF'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit(f"bench/gpu/omni.sh: torch {torch.__version__} sees no CUDA device; install a CUDA build of torch")
print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
EOF

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# can_run FAMILY CONFIG: a tiny checkpoint of FAMILY, and `check` on CUDA for every stage of CONFIG.
can_run() {
    echo "== $1: every model stage can run on CUDA (check --device cuda --dtype bfloat16)"
    "$PY" -m omnitrio tiny-model "$1" "$TMP/$1" >/dev/null
    "$PY" -m omnitrio check --model "$TMP/$1" --device cuda --dtype bfloat16 "$2" >/dev/null
}

qwen3() {
    can_run qwen3-omni configs/qwen3-omni.toml
    echo "== qwen3-omni: equality on CUDA (pipeline: inline and one process per stage; HTTP)"
    timeout 300 "$PY" -m pytest tests/test_qwen3_omni_pipeline.py tests/test_qwen3_omni_serve.py \
        -q -x -n 0 -p no:cacheprovider
    echo "== qwen3-omni: benchmark on CUDA"
    # one code2wav copy: on one GPU a single process batches every request (the config's two are for two CPU cores)
    timeout 240 "$PY" bench/qwen3_omni.py --device cuda --dtype float32 --set processes.code2wav.replicas=1 \
        --out bench/results/qwen3_omni_gpu.json
    timeout 120 "$PY" bench/qwen3_omni.py --device cuda --dtype bfloat16 --quick \
        --out bench/results/qwen3_omni_gpu_bf16.json
}

qwen2_5() {
    can_run qwen2.5-omni configs/qwen2.5-omni.toml
    local tests
    mapfile -t tests < <(grep -lw DEVICE tests/test_qwen2_5_omni_*.py || true)
    if ((${#tests[@]})); then
        echo "== qwen2.5-omni: equality on CUDA (${tests[*]})"
        timeout 300 "$PY" -m pytest "${tests[@]}" -q -x -n 0 -p no:cacheprovider
    else
        echo "== qwen2.5-omni: no test module places its pipeline by DEVICE yet"
    fi
    echo "== qwen2.5-omni: benchmark on CUDA (streamed and whole)"
    # one token2wav copy: on one GPU a single process batches every request's windows (the config's two copies
    # are for two CPU cores)
    timeout 300 "$PY" bench/qwen2_5_omni.py --device cuda --dtype float32 --set processes.token2wav.replicas=1 \
        --out bench/results/qwen2_5_omni_gpu.json
    timeout 120 "$PY" bench/qwen2_5_omni.py --device cuda --dtype bfloat16 --quick \
        --out bench/results/qwen2_5_omni_gpu_bf16.json
}

case "$FAMILY" in
    qwen3) qwen3 ;;
    qwen2.5) qwen2_5 ;;
    all) qwen3; qwen2_5 ;;
esac
