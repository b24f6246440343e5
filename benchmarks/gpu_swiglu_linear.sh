#!/usr/bin/env bash
# swiglu_linear on the GPU machine, from the repo root, with fk installed (Liger optional):
# the op's GPU tests, the forward sweep (configs still in question) and the benchmark at
# Llama-3-8B, 8192 tokens. Logs and the CSV go to $OUT (default ./gpu_out). ~5 minutes.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, fk; print(torch.__version__, fk.build_info())" | tee -a "$OUT/gpu.txt"
FK_BLOCK_TRITON=1 python3 -m pytest tests/ops/test_swiglu_linear.py -m cuda -q \
  -p no:cacheprovider 2>&1 | tee "$OUT/tests_swiglu_linear.log" | tail -15
rc=${PIPESTATUS[0]}
timeout 300 python3 benchmarks/tune_swiglu_linear.py 2>&1 | tee "$OUT/tune_swiglu_linear.log"
python3 benchmarks/benchmark_swiglu_linear.py --tokens 8192 --out "$OUT" 2>&1 \
  | tee "$OUT/bench_swiglu_linear.log"
exit "$rc"
