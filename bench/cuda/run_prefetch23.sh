#!/bin/bash
# Issue 23, the weight prefetch (backend/cuda/prefetch.h), device side, one
# call with make_carry_prefetch23.sh's pack: the prefetch tests and the
# Llama / FP8 / batch-invariance GPU tests (FILTER), then the random
# Llama-3.1-8B (made here while the tests run) through bench_cuda once per
# MODE:CAPS in CONFIGS (RILL_CUDA_PREFETCH_MODE: bulk, lines, side-bulk,
# side-lines; RILL_CUDA_PREFETCH: "MB" or "MBo,MBgu,MBqkv", 0 = off),
# bf16 at --batches BATCHES (default 1,64,128) and, unless FP8=0, FP8
# (--quantize fp8) at FP8_BATCHES (default 1,64). ROUNDS (default 1)
# repeats the whole sweep, so the configurations interleave. BUDGET (s,
# default 540) stops starting runs.
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
    --gtest_filter="${FILTER:-CudaPrefetch.*:LlamaFamily/CudaHf.*:*Fp8*:*BatchInvariant*llama*}" > /tmp/tests.log 2>&1
  RC=$?; echo "tests rc=$RC at $(( $(date +%s) - T0 )) s"
  grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|Failure|Expected|Which is" /tmp/tests.log | cut -c1-200 | head -24
fi
[ -n "${MK:-}" ] && { wait "$MK"; echo "model made at $(( $(date +%s) - T0 )) s"; }
for round in $(seq "${ROUNDS:-1}"); do
  for cfg in ${CONFIGS:-bulk:0 side-bulk:64,0,0 side-lines:64,0,0 lines:64,0,0 side-bulk:64,24,24 \
               side-lines:64,24,24 side-bulk:0,0,24 bulk:0}; do
    mode=${cfg%%:*}; caps=${cfg#*:}
    for kind in bf16 fp8; do
      [ "$kind" = fp8 ] && [ "${FP8:-1}" = 0 ] && continue
      [ "$(left)" -lt 40 ] && { echo "== $kind $cfg skipped (time)"; continue; }
      if [ "$kind" = bf16 ]; then args="--batches ${BATCHES:-1,64,128}"; else args="--quantize fp8 --batches ${FP8_BATCHES:-1,64}"; fi
      # shellcheck disable=SC2086
      RILL_CUDA_PREFETCH_MODE=$mode RILL_CUDA_PREFETCH=$caps timeout 60 "$V/bench_cuda" $M --steps 16 \
        --prefill 128 $args > /tmp/e2e.log 2>&1
      echo "== round $round $kind $mode $caps rc=$? at $(( $(date +%s) - T0 )) s"
      grep -E "^decode|rror|RILL_CUDA" /tmp/e2e.log | cut -c1-100
    done
  done
done
date -u
exit $RC
