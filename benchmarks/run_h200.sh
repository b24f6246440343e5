#!/usr/bin/env bash
# The GPU-machine run: installs the prebuilt wheel from dist/ (and wheels from .whl/, e.g.
# Liger Kernel) into a private folder, then runs the steps named in $1 (default: all):
#   tests  GPU tests (marker cuda) with triton made unimportable; TEST_OPS="rope softmax" picks
#          some files of tests/ops, and NO_TRITON_PASS=0 leaves out the pass that checks that
#          nothing imports triton (it reruns those tests)
#   tune   launch-config sweeps with Triton's JIT (benchmarks/tune_<op>.py; TUNE_OPS picks some)
#   cold   first-call latency in fresh processes (fk, torch.compile, Liger)
#   bench  the op benchmarks at Llama-3-8B shapes, each twice (the spread is the noise);
#          BENCH_OPS="rope softmax" (or "rope,softmax") picks some
#   targets  the kernel issues' target shapes, fwd + bwd (TARGET_OPS="jsd tvd" picks some;
#            TARGET_ARGS is passed on, e.g. "--timer kernels --no-compile")
#   sweeps   the issues' seed-style tables: Llama-3-8B shapes over 1024-8192 tokens, fwd + bwd
#            (SWEEP_OPS picks some)
#   rows     the README's other speed figures (router, MoE, qkv, FP8 and SwiGLU GEMM ops at
#            their README shapes), each with CUDA events per call, then kernel time where the
#            benchmark has --timer (ROW_OPS picks some); with bench (BENCH_ARGS="--tokens 8192")
#            and targets, every README row on this GPU
#   hf     full training steps of a ~1B Llama (Llama-3.2-1B shape): eager HF, fk, Liger
#          (benchmarks/benchmark_hf_training.py; HF_ARGS is passed on, e.g. "--batch 4")
#   compare  this wheel against another build of fk (the wheel in $COMPARE_WHEEL_DIR, e.g.
#          an earlier release): each benchmark of COMPARE_OPS runs with fk only (no
#          torch.compile; Liger and torch eager as installed) alternately on the two
#          builds, COMPARE_PASSES times each, at COMPARE_TOKENS, with the timers of
#          COMPARE_TIMERS (default: per call with events, then per kernel: GPU time); logs
#          compare_<op>_<build>.log
# Logs and CSVs go to $OUT (default ./gpu_out). With PACK=1 they are packed at exit (also
# when the run is stopped with SIGTERM, e.g. by `timeout`) into $OUT/gpu_out.tar.gz alone,
# for callers that bring back only a few files.
set -uo pipefail
STEPS=${1:-tests,cold,bench}
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
pack() {
  [[ ${PACK:-0} == 1 ]] || return 0
  local tmp
  tmp=$(mktemp -d)
  tar czf "$tmp/gpu_out.tar.gz" -C "$OUT" . && rm -rf "${OUT:?}"/* && mv "$tmp/gpu_out.tar.gz" "$OUT/"
  rmdir "$tmp"
}
trap pack EXIT
trap 'exit 143' TERM
# fk goes into the machine's Python environment, as a user installs it; other wheels (.whl/)
# and an sm_80-only build of fk (dist-sm80/, for the missing-arch error) into folders aside.
python3 -m pip install -q --no-index --no-deps --no-compile --force-reinstall dist/fk-*.whl || exit 1
SITE=/tmp/fk_site
rm -rf "$SITE" /tmp/fk_sm80
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl || exit 1
fi
if ls dist-sm80/fk-*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fk_sm80 dist-sm80/fk-*.whl
  export FK_SM80_ONLY_LIBRARY=/tmp/fk_sm80/fk/lib/libfk.so
fi
export PYTHONPATH=$SITE PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, fk; print(torch.__version__, fk.build_info())" | tee -a "$OUT/gpu.txt"
rc=0
# picked "$LIST" op: whether op is in a space- or comma-separated LIST (an empty LIST: all).
picked() { [[ -z $1 || " ${1//,/ } " == *" $2 "* ]]; }
# logged LOG op args...: runs benchmarks/benchmark_<op>.py with args, under a header, into LOG.
logged() {
  local log=$1 op=$2
  shift 2
  echo "### benchmark_$op.py $*" | tee -a "$log"
  python3 benchmarks/benchmark_$op.py "$@" 2>&1 | tee -a "$log"
}
if [[ $STEPS == *tests* ]]; then
  TOPS=tests/ops
  if [[ -n ${TEST_OPS:-} ]]; then
    TOPS=
    for op in ${TEST_OPS//,/ }; do TOPS+=" tests/ops/test_$op.py"; done
  fi
  FK_BLOCK_TRITON=1 python3 -m pytest $TOPS -m cuda -q -p no:cacheprovider 2>&1 \
    | tee "$OUT/tests.log" | tail -25
  rc=${PIPESTATUS[0]}
  # Integration (TorchScript, the C++ program on this GPU, wheel, missing-arch error).
  FK_BLOCK_TRITON=1 python3 -m pytest tests/integration -q -p no:cacheprovider 2>&1 \
    | tee "$OUT/tests_integration.log" | tail -5
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  # Hugging Face models patched by fk.transformers: convergence and generate on this GPU.
  FK_BLOCK_TRITON=1 python3 -m pytest tests/transformers -m cuda -q -p no:cacheprovider 2>&1 \
    | tee "$OUT/tests_transformers.log" | tail -5
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  # torch.compile, opcheck and torch's dispatch modes (a TorchDispatchMode test) import triton
  # through torch itself when it is installed.
  if [[ ${NO_TRITON_PASS:-1} == 1 ]]; then
    FK_CHECK_NO_TRITON=1 python3 -m pytest $TOPS -m cuda \
      -k "not compile and not opcheck and not asks_only_for_needed_gradients" -q -x \
      -p no:cacheprovider 2>&1 | tee "$OUT/tests_no_triton_import.log" | tail -3
    [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  fi
fi
if [[ $STEPS == *tune* ]]; then
  # TUNE_OPS (spaces or commas) restricts the sweeps; default: every benchmarks/tune_<op>.py.
  TOPS=${TUNE_OPS:-$(ls benchmarks/tune_*.py | sed 's|.*/tune_||; s|\.py$||')}
  for op in ${TOPS//,/ }; do
    python3 benchmarks/tune_$op.py 2>&1 | tee -a "$OUT/tune.log"
  done
fi
if [[ $STEPS == *probe* ]]; then
  python3 benchmarks/probes/first_backward.py trace 2>&1 | tee "$OUT/probe.log"
fi
if [[ $STEPS == *cold* ]]; then
  python3 benchmarks/cold_start.py --out "$OUT/cold_start.jsonl" 2>&1 | tee "$OUT/cold_start.log"
fi
if [[ $STEPS == *bench* ]]; then
  # BENCH_OPS (spaces or commas) restricts the ops; default: every benchmarks/benchmark_<op>.py.
  OPS=${BENCH_OPS:-$(ls benchmarks/benchmark_*.py | sed 's|.*/benchmark_||; s|\.py$||')}
  OPS=${OPS//,/ }
  # BENCH_PASSES (default 2) runs; BENCH_ARGS is passed on (e.g. "--tokens 8192").
  for pass in $(seq ${BENCH_PASSES:-2}); do
    for op in $OPS; do
      python3 benchmarks/benchmark_$op.py --model llama_3_8b --sweep-mode token_length \
        --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee -a "$OUT/bench_$op.log"
    done
  done
fi
if [[ $STEPS == *targets* ]]; then
  # The target shapes of the kernel issues (fwd + bwd, each provider once, one process per
  # line); TARGET_OPS picks some (default: all of them).
  tgt() {
    local op=$1
    shift
    picked "${TARGET_OPS:-}" $op || return 0
    logged "$OUT/targets_$op.log" $op --modes full --measure-ceiling --out "$OUT" "$@" \
      ${TARGET_ARGS:-}
  }
  for op in jsd kl_div tvd; do
    tgt $op --dtype fp32 --tokens 4096
    tgt $op --dtype bf16 --tokens 8192
  done
  tgt fused_linear_jsd --tokens 8192
  tgt group_norm --tokens 32 --channels 512 --hw 4096 --groups 32
  tgt dyt --tokens 8192
  tgt poly_norm --tokens 8192
  tgt sparsemax --tokens 8192 --width 4096,32768
  tgt tiled_mlp --tokens 65536
  tgt llama4_rope --tokens 8192
  tgt qwen2vl_mrope --tokens 8192
  tgt neighborhood_attention --seq-lens 8192,32768 --kernel-sizes 7,49
fi
if [[ $STEPS == *rows* ]]; then
  row() {
    local op=$1 timers=$2
    shift 2
    picked "${ROW_OPS:-}" $op || return 0
    for timer in $timers; do
      local t=()
      [[ $timer == - ]] || t=(--timer "$timer")
      logged "$OUT/rows_$op.log" $op "$@" "${t[@]}"
    done
  }
  row router_logits - --tokens 8192
  row qkv_split_norm_rope "events kernels" --model qwen3_30b_a3b --tokens 8192 --no-compile \
    --rounds 3 --measure-ceiling --out "$OUT"
  row gated_group_rms_norm "events kernels" --tokens 8192 --no-compile --rounds 3 \
    --measure-ceiling --out "$OUT"
  for moe in linghe qwen3_30b_a3b; do
    for mop in permute unpermute; do
      row moe_permute "events kernels" --moe $moe --op $mop --tokens 8192 --rounds 3 \
        --measure-ceiling --out "$OUT"
    done
  done
  row fp8_quantize "events kernels" --tokens 8192 --layout both --rounds 3 --measure-ceiling \
    --out "$OUT"
  row swiglu_fp8 "events kernels" --model llama_3_8b --tokens 8192 --layout both --rounds 3 \
    --measure-ceiling --out "$OUT"
  row fp8_linear events --tokens 8192 --rounds 2 --out "$OUT"
  row swiglu_linear events --tokens 8192 --rounds 3 --out "$OUT"
fi
if [[ $STEPS == *sweeps* ]]; then
  # The seed-style tables the kernel issues ask for: Llama-3-8B shapes over 1024-8192 tokens
  # (--sweep-mode token_length), fwd + bwd, every provider; SWEEP_OPS picks some.
  for op in ${SWEEP_OPS:-jsd kl_div tvd fused_linear_jsd dyt poly_norm sparsemax llama4_rope qwen2vl_mrope}; do
    op=${op//,/ }
    echo "### benchmark_$op.py --model llama_3_8b --sweep-mode token_length" | tee -a "$OUT/sweep_$op.log"
    python3 benchmarks/benchmark_$op.py --model llama_3_8b --sweep-mode token_length --modes full \
      --measure-ceiling --out "$OUT" 2>&1 | tee -a "$OUT/sweep_$op.log"
  done
fi
if [[ $STEPS == *hf* ]]; then
  # Each provider in its own process; the CSV goes to $OUT, the targets' PASS/FAIL to the log.
  python3 benchmarks/benchmark_hf_training.py --out "$OUT" ${HF_ARGS:-} 2>&1 \
    | tee "$OUT/hf_training.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
fi
if [[ $STEPS == *compare* ]]; then
  OTHER=/tmp/fk_other
  rm -rf "$OTHER"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$OTHER" \
    "${COMPARE_WHEEL_DIR:?set COMPARE_WHEEL_DIR}"/fk-*.whl || exit 1
  CTOK=${COMPARE_TOKENS:-1,8192}
  for op in ${COMPARE_OPS:-rms_norm layer_norm}; do
    for pass in $(seq ${COMPARE_PASSES:-2}); do
      for build in this other; do
        path=$SITE
        [[ $build == other ]] && path=$OTHER:$SITE
        for timer in ${COMPARE_TIMERS:-events kernels}; do
          PYTHONPATH=$path python3 -c "import fk; print('fk build:', fk.build_info())" \
            >> "$OUT/compare_${op}_$build.log"
          PYTHONPATH=$path python3 benchmarks/benchmark_$op.py --model llama_3_8b \
            --tokens "$CTOK" --modes full --no-compile --rounds 3 --timer $timer --out '' \
            >> "$OUT/compare_${op}_$build.log" 2>&1
        done
      done
    done
  done
fi
exit $rc
