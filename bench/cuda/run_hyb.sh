#!/bin/bash
# Device side of make_carry_hyb.sh: unpacks the binaries into /tmp/hyb, runs
# each GPU test (logs under $OUT) and prints the measured errors and a
# pass/fail line per binary; then (unless $1 is "tests") makes the
# qwen3.5-4b preset (bf16, random weights) and runs bench_cuda on it at
# batch 1 and 64 (prefill 2,048 tokens), the table last.
cd "$(dirname "$0")"
G=/tmp/hyb
mkdir -p $G/bin && cp bin/*.gz $G/bin/ && gunzip -f $G/bin/*.gz && chmod +x $G/bin/*
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export RILL_SHARED_DIR=$PWD/shared PYTHONUNBUFFERED=1
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
M=/tmp/q35
if [ "$1" != "tests" ]; then  # the model is made in the background while the tests run
  (t0=$(date +%s); python3 shared/tools/make_random_model.py qwen3.5-4b $M > /tmp/make.log 2>&1; \
   echo "make model rc=$? $(( $(date +%s) - t0 )) s" >> /tmp/make.log) &
  MAKER=$!
fi
summary=""
for n in test_cuda_gated_delta_cuda_test test_cuda_qwen3_next_cuda_test ${TESTS:-test_cuda_llama_cuda_test test_cuda_gemma_cuda_test}; do
  t=$G/bin/$n
  start=$(date +%s%N)
  timeout ${TEST_TIMEOUT:-120} $t > $OUT/$n.log 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  summary="$summary$(printf '%-34s rc=%-3s %6d ms  %s' $n $rc $ms "$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' $OUT/$n.log | tr '\n' ' ')")\n"
done
grep -h -E "^\[ cuda" $OUT/*.log
grep -h -E "FAILED|Failure|Expected|Which is|error|rror:" $OUT/*.log | head -40
printf "$summary"
[ "$1" = "tests" ] && exit 0
wait $MAKER; tail -2 /tmp/make.log
timeout ${BENCH_TIMEOUT:-240} $G/bin/bench_cuda $M --steps 32 --batches 1,64 --json $OUT/bench.json 2>&1 | tee $OUT/bench.log
exit 0
