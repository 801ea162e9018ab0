#!/usr/bin/env bash
# The GPU device check (issue #26): honest bf16 rollouts generated and validated on a CUDA GPU,
# validated on the CPU in float32, the weight cheats caught, decode speed against HF generate.
# One JSON object per line (benchmarks/gpu_check.py); fits 10 minutes on one GPU.
# Usage: bash benchmarks/gpu_check.sh [gpu_check.py options]   (run from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
if ! PYTHONPATH=src "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)'; then
    echo "gpu_check: no CUDA device on this machine (torch $(PYTHONPATH=src "$PY" -c 'import torch; print(torch.__version__)')); nothing checked"
    exit 2
fi
exec env PYTHONPATH=src timeout 570 "$PY" benchmarks/gpu_check.py "$@"
