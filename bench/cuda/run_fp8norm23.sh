#!/bin/bash
# Issue 23, the FP8 pre-norm that quantizes for the GEMM (rms_norm_fp8,
# Backend::norm_matmul), device side, one call with
# make_carry_fp8norm23.sh's pack: the FP8 and Llama GPU tests (FILTER),
# then the random Llama-3.1-8B (made here while the tests run) through
# bench_cuda once per RILL_FP8_NORM_QUANT value in CONFIGS (default "0 1"),
# FP8 (--quantize fp8) at FP8_BATCHES (default 1,8,64) and, unless BF16=0,
# bf16 at BATCHES (default 1,64,128; norm_matmul's default path there).
# ROUNDS (default 2) repeats the sweep, so the settings interleave. BUDGET
# (s, default 540) stops starting runs.
T0=$(date +%s)
R=$PWD; V=$(cd "$(dirname "$0")" && pwd)
BUDGET=${BUDGET:-540}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
mkdir -p /work && ln -sfn "$R" /work/main && (cd /work && tar xJf "$V/shared.tar.xz")
[ -x "$V/tests" ] || tar xJf "$V/bins.tar.xz" -C "$V"
chmod +x "$V/tests" "$V/bench_cuda"
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
M=/tmp/llama8b
if [ ! -f $M.done ]; then
  (python3 /work/shared/tools/make_random_model.py llama-3.1-8b $M > /tmp/make.log 2>&1 && touch $M.done) &
  MK=$!
fi
cd /tmp
RC=0
if [ "${FILTER:-}" != none ]; then
  timeout "${TEST_LIMIT:-150}" "$V/tests" \
    --gtest_filter="${FILTER:-Fp8NormQuant.*:Fp8Glu.*:Fp8Weights.*:LlamaFamily/CudaHf.*:*BatchInvariant*llama*}" > /tmp/tests.log 2>&1
  RC=$?; echo "tests rc=$RC at $(( $(date +%s) - T0 )) s"
  grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|Failure|Expected|Which is" /tmp/tests.log | cut -c1-200 | head -24
fi
[ -n "${MK:-}" ] && { wait "$MK"; echo "model made at $(( $(date +%s) - T0 )) s"; }
for round in $(seq "${ROUNDS:-2}"); do
  for cfg in ${CONFIGS:-0 1}; do
    for kind in fp8 bf16; do
      [ "$kind" = bf16 ] && { [ "${BF16:-1}" = 0 ] || [ "$round" -gt 1 ]; } && continue
      [ "$(left)" -lt 40 ] && { echo "== $kind $cfg skipped (time)"; continue; }
      if [ "$kind" = bf16 ]; then args="--batches ${BATCHES:-1,64,128}"; else args="--quantize fp8 --batches ${FP8_BATCHES:-1,8,64}"; fi
      # shellcheck disable=SC2086
      RILL_FP8_NORM_QUANT=$cfg timeout 60 "$V/bench_cuda" $M --steps 16 --prefill 2048 $args > /tmp/e2e.log 2>&1
      echo "== round $round $kind RILL_FP8_NORM_QUANT=$cfg rc=$? at $(( $(date +%s) - T0 )) s"
      grep -E "^decode|^prefill|rror" /tmp/e2e.log | cut -c1-100
    done
  done
done
date -u
exit $RC
